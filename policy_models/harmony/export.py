"""Export Harmony placement to ONNX with its model card, and plot the learning curve.

The graph keeps the number of jobs and of nodes symbolic (the card's -1), so one file serves
any cluster size."""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path

import torch

from mlsched.features import harmony_state
from mlsched.features.card import ModelCard, card_path
from mlsched.sim.simulator import SIMULATOR_VERSION
from policy_models.harmony import networks

OPSET = 18
INPUTS = ("jobs", "current", "role", "nodes", "mask")
ACTIONS = ("One probability per node for the task being placed (its job is the `current` one-hot "
           "over the job tokens; `role` 1 for a PS, 0 for a worker); nodes the task does not fit "
           "on (mask 0) have probability 0. Serving places the task on the most probable node.")


def example_inputs(jobs: int = 5, nodes: int = 7) -> tuple[torch.Tensor, ...]:
    current = torch.zeros(1, jobs)
    current[0, 0] = 1.0
    return (torch.rand(1, jobs, harmony_state.JOB_FEATURES), current, torch.zeros(1, 1),
            torch.rand(1, nodes, harmony_state.NODE_FEATURES), torch.ones(1, nodes))


def export_onnx(net: networks.HarmonyNet, path: Path) -> None:
    module = networks.ProbabilityModule(net).eval()
    path.parent.mkdir(parents=True, exist_ok=True)
    dynamic = {"jobs": {0: "batch", 1: "jobs"}, "current": {0: "batch", 1: "jobs"}, "role": {0: "batch"},
               "nodes": {0: "batch", 1: "nodes"}, "mask": {0: "batch", 1: "nodes"},
               "probs": {0: "batch", 1: "nodes"}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, example_inputs(), str(path), input_names=list(INPUTS),
                          output_names=["probs"], opset_version=OPSET, dynamo=False, dynamic_axes=dynamic)


def export(net: networks.HarmonyNet, path: Path, training: dict, validation: dict,
           extras: dict | None = None) -> dict:
    export_onnx(net, path)
    enc = harmony_state.ENCODER
    card = ModelCard(
        algorithm="harmony", phase="placement", encoder_name=enc.name, encoder_version=enc.version,
        encoder_params={}, inputs=enc.inputs({}), outputs=enc.outputs({}), actions=ACTIONS,
        onnx_sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
        training={**training, "simulator_version": SIMULATOR_VERSION},
        validation=validation, extras={"onnx_opset": OPSET, "network": dict(net.config), **(extras or {})},
    )
    card.write(card_path(path))
    return card.to_json()


def save_state(net: networks.HarmonyNet, path: Path) -> None:
    torch.save({"config": net.config, "state": net.state_dict()}, path)


def load_state(path: Path) -> networks.HarmonyNet:
    """A network from a torch state file written next to the ONNX one (training resumes)."""
    raw = torch.load(path, weights_only=True)
    net = networks.HarmonyNet(**raw["config"])
    net.load_state_dict(raw["state"])
    return net


def plot_curve(curve: list[dict], path: Path) -> None:
    """Validation avg JCT over LIF-Line's after imitation and every few actor-critic episodes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(len(curve)), [c["val_jct_over_lif"] for c in curve], marker="o")
    ax.axhline(1.0, color="grey", linestyle="--", label="LIF-Line")
    ax.axhline(0.8, color="red", linestyle=":", label="issue 15 target")
    ax.set_xticks(range(len(curve)), [c["where"].replace("actor-critic ", "AC ") for c in curve],
                  rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("validation avg JCT / LIF-Line")
    ax.set_title("Harmony placement training")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
