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
           extras: dict | None = None, domain: dict | None = None) -> dict:
    """`domain`: the setting it was trained in (policy_models/domain.py harmony)."""
    export_onnx(net, path)
    enc = harmony_state.ENCODER
    card = ModelCard(
        algorithm="harmony", phase="placement", encoder_name=enc.name, encoder_version=enc.version,
        encoder_params={}, inputs=enc.inputs({}), outputs=enc.outputs({}), actions=ACTIONS,
        onnx_sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
        training={**training, "simulator_version": SIMULATOR_VERSION},
        validation=validation, extras={"onnx_opset": OPSET, "network": dict(net.config), **(extras or {})},
        domain=domain or {},
    )
    card.write(card_path(path))
    return card.to_json()


def save_state(net: networks.HarmonyNet, path: Path) -> None:
    torch.save({"config": net.config, "state": net.state_dict()}, path)


def load_state(path: Path) -> networks.HarmonyNet:
    """A network from a torch state file written next to the ONNX one (training resumes), or
    from an exported .onnx file and its card (state_from_onnx)."""
    if Path(path).suffix == ".onnx":
        return state_from_onnx(Path(path))
    raw = torch.load(path, weights_only=True)
    net = networks.HarmonyNet(**raw["config"])
    net.load_state_dict(raw["state"])
    return net


def state_from_onnx(path: Path) -> networks.HarmonyNet:
    """The policy network back from an exported graph: its size from the card, each weight
    from the initializer its layer's node reads (a MatMul node `/encoder.0/qkv/MatMul` holds
    `encoder.0.qkv.weight`, transposed; biases and norms keep their names). The critic is not
    exported, so its head starts afresh. Lets a shipped model be fine-tuned (`--init
    harmony.onnx`) or re-exported when only the graph changes."""
    import onnx
    from onnx import numpy_helper

    card = ModelCard.read(card_path(path))
    net = networks.HarmonyNet(**card.extras["network"])
    graph = onnx.load(str(path)).graph
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    # The exporter shares equal constants (an untrained network's layer norms): an Identity
    # node then stands for the initializer.
    alias = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "Identity" and n.input[0] in inits}
    found: dict[str, torch.Tensor] = {}
    for node in graph.node:
        module = _module_path(node.name)
        for position, name in enumerate(node.input):
            name = alias.get(name, name)
            if name not in inits:
                continue
            value = torch.from_numpy(inits[name].copy())
            role = _PARAMETER.get((node.op_type, position))
            if role == "weight.T":
                found[f"{module}.weight"] = value.T
            elif role is not None:
                found[f"{module}.{role}"] = value
            elif name.startswith("net."):  # a parameter used in part (a Slice), by its own name
                found.setdefault(name[len("net."):], value)
    state = net.state_dict()
    missing = [k for k in state if k not in found and not k.startswith("value_head.")]
    if missing:
        raise ValueError(f"{path}: no weights for {missing} in the graph")
    net.load_state_dict({**state, **{k: v.reshape(state[k].shape) for k, v in found.items() if k in state}})
    return net.eval()


# (op, input position) -> which parameter of the node's module that input is. Linear layers
# export as MatMul(x, Wᵀ) + Add(b) (Gemm for 2-D inputs, W as is with transB).
_PARAMETER = {("MatMul", 1): "weight.T", ("Add", 0): "bias", ("Add", 1): "bias",
              ("Gemm", 1): "weight", ("Gemm", 2): "bias",
              ("LayerNormalization", 1): "weight", ("LayerNormalization", 2): "bias"}


def _module_path(node_name: str) -> str:
    """`/encoder.0/ff/ff.0/MatMul` -> `encoder.0.ff.0`: the exporter names a container's child
    `<container>.<index>` in the scope below the container's own."""
    parts: list[str] = []
    for scope in node_name.strip("/").split("/")[:-1]:
        if parts and scope.startswith(parts[-1] + "."):
            parts[-1] = scope
        else:
            parts.append(scope)
    return ".".join(parts)


def reexport(path: Path) -> dict:
    """Write `path` again from its own weights with the current graph code, keeping its card's
    training and validation (a graph-only change: the numbers it computes stay the same)."""
    card = ModelCard.read(card_path(path))
    net = state_from_onnx(path)
    training = {**card.training, "reexported": "same weights, graph of policy_models/harmony/networks.py "
                                               "as of this file's export"}
    extras = {k: v for k, v in card.extras.items() if k not in ("onnx_opset", "network")}
    return export(net, path, training, card.validation, extras, card.domain)


if __name__ == "__main__":  # pragma: no cover
    import sys

    for arg in sys.argv[1:]:
        print(f"re-exported {arg}: sha256 {reexport(Path(arg))['onnx_sha256']}")


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
