"""Export a Chic or Chic-Pair network to ONNX with its model card, and plot the learning curve."""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path

import torch

from mlsched.features import chic_state
from mlsched.features.card import ModelCard, card_path
from mlsched.sim.simulator import SIMULATOR_VERSION
from policy_models.chic import networks

OPSET = 18


def actions_text(pair: bool) -> str:
    if pair:
        return ("I+1 probabilities over the first I jobs in arrival order: action i gives job i one "
                "worker and one PS (its starting gang when it holds nothing); action I stops the round. "
                "Masked actions have probability 0.")
    return ("2I+1 probabilities over the first I jobs in arrival order: action 2i gives job i one "
            "worker, 2i+1 one PS (its starting gang when it holds nothing); action 2I stops the round. "
            "Masked actions have probability 0.")


def export_onnx(net: networks.ChicNet, jobs: int, pair: bool, path: Path) -> None:
    module = networks.ProbabilityModule(net).eval()
    state = torch.zeros(1, chic_state.state_dim(jobs))
    mask = torch.ones(1, chic_state.n_actions(jobs, pair))
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (state, mask), str(path), input_names=["state", "mask"],
                          output_names=["probs"], opset_version=OPSET, dynamo=False,
                          dynamic_axes={"state": {0: "batch"}, "mask": {0: "batch"}, "probs": {0: "batch"}})


def export(net: networks.ChicNet, algorithm: str, jobs: int, pair: bool, path: Path, training: dict,
           validation: dict, extras: dict | None = None, domain: dict | None = None) -> dict:
    """`domain`: the setting it was trained in (policy_models/domain.py chic)."""
    export_onnx(net, jobs, pair, path)
    params = {"jobs": jobs, "pair": pair}
    card = ModelCard(
        algorithm=algorithm, phase="allocation",
        encoder_name=chic_state.ENCODER.name, encoder_version=chic_state.ENCODER.version,
        encoder_params=params,
        inputs=chic_state.ENCODER.inputs(params), outputs=chic_state.ENCODER.outputs(params),
        actions=actions_text(pair), onnx_sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
        training={**training, "simulator_version": SIMULATOR_VERSION},
        validation=validation, extras={"onnx_opset": OPSET, **(extras or {})},
        domain=domain or {},
    )
    card.write(card_path(path))
    return card.to_json()


def plot_curve(curve: list[dict], optimus_jct_s: float, algorithm: str, path: Path) -> None:
    """Fig. 6 style: the elite threshold and mean return per iteration; validation ACT."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    it = [c["iteration"] for c in curve]
    ax1.plot(it, [c["threshold"] for c in curve], label="elite threshold ξ̂_k")
    ax1.plot(it, [c["mean_return"] for c in curve], label="mean return R (sampled episodes)")
    ax1.set_xlabel("CEM iteration")
    ax1.set_ylabel("return (−Σ JCT / 20 min)")
    ax1.legend(fontsize=8)
    val = [c for c in curve if "val_act_s" in c]
    ax2.plot([c["iteration"] for c in val], [c["val_act_s"] / 3600 for c in val], marker=".",
             label=f"{algorithm} (as served)")
    ax2.axhline(optimus_jct_s / 3600, color="tab:green", linestyle=":", label="Optimus (600 s interval)")
    ax2.set_xlabel("CEM iteration")
    ax2.set_ylabel("validation average JCT (hours)")
    ax2.legend(fontsize=8)
    fig.suptitle(f"{algorithm}: modified cross-entropy method")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
