"""Export a DL² policy network to ONNX with its model card, and plot the learning curve."""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path

import torch

from mlsched.features import dl2_state
from mlsched.features.card import ModelCard, card_path
from mlsched.sim.simulator import SIMULATOR_VERSION
from policy_models.dl2 import networks

ACTIONS = ("3J+1 probabilities over J = window job slots (arrival order): action 3i grows job i "
           "by one worker, 3i+1 by one PS, 3i+2 by a worker and a PS (its starting gang when it "
           "holds nothing); action 3J stops the round. Masked actions have probability 0.")

OPSET = 18


def export_onnx(net: torch.nn.Module, window: int, path: Path) -> None:
    module = networks.ProbabilityModule(net).eval()
    state = torch.zeros(1, dl2_state.state_dim(window, getattr(net, "typed", False)))
    mask = torch.ones(1, dl2_state.n_actions(window))
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # The TorchScript-based exporter: these small MLPs need nothing newer, and it does not
        # need onnxscript at export time. No constant folding here: the file keeps every weight
        # whole under its parameter name (reexport.py reads them back by name), and ONNX Runtime
        # folds the slices of them once, when it loads the model.
        torch.onnx.export(module, (state, mask), str(path), input_names=["state", "mask"],
                          output_names=["probs"], opset_version=OPSET, dynamo=False, do_constant_folding=False,
                          dynamic_axes={"state": {0: "batch"}, "mask": {0: "batch"}, "probs": {0: "batch"}})


def export(net: torch.nn.Module, args, path: Path, phase: str, training: dict, validation: dict,
           extras: dict | None = None, domain: dict | None = None) -> dict:
    """`domain`: the setting it was trained in (policy_models/domain.py dl2)."""
    export_onnx(net, args.window, path)
    params = {"window": args.window}
    if getattr(net, "typed", False):  # the GPU-type columns (absent: untyped, as before types)
        params["gpu_types"] = True
    card = ModelCard(
        algorithm="dl2", phase="allocation",
        encoder_name=dl2_state.ENCODER.name, encoder_version=dl2_state.ENCODER.version,
        encoder_params=params,
        inputs=dl2_state.ENCODER.inputs(params), outputs=dl2_state.ENCODER.outputs(params),
        actions=ACTIONS, onnx_sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
        training={**training, "stage": phase, "simulator_version": SIMULATOR_VERSION},
        validation=validation,
        extras={"architecture": {"arch": args.arch, "hidden": list(args.hidden)},
                "onnx_opset": OPSET, **(extras or {})},
        domain=domain or {},
    )
    card.write(card_path(path))
    return card.to_json()


def plot_curve(curve, baselines: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(curve[0][1])
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4), squeeze=False)
    steps = [s for s, _ in curve]
    for ax, name in zip(axes[0], names):
        ax.plot(steps, [v[name] / 3600 for _, v in curve], marker=".", label="DL² (greedy), step 0 = SL only")
        ax.axhline(baselines["drf"][name] / 3600, color="tab:red", linestyle="--", label="DRF")
        ax.axhline(baselines["optimus"][name] / 3600, color="tab:green", linestyle=":", label="Optimus")
        ax.set_xlabel("RL step (training episodes)")
        ax.set_ylabel("validation avg JCT (hours)")
        ax.set_title(f"validation: {name}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
