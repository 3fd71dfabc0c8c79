"""A torch DL² network from an ONNX graph: retraining starts from the active model's weights.

The exporter keeps every weight whole under its parameter name (`net.<parameter>`; export.py
exports without constant folding for this reason), and the card names the architecture and
hidden sizes, so the policy half of the network is rebuilt exactly and no torch checkpoint
has to be kept beside a published model. The value network is not in the graph (serving
does not need it): it starts fresh, and retraining fits it before the policy moves.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from mlsched.features.card import ModelCard, card_path
from policy_models.dl2 import networks

PREFIX = "net."


def network_args(card: ModelCard) -> SimpleNamespace:
    """What export.export needs to know about the network: window, arch, hidden sizes."""
    arch = (card.extras or {}).get("architecture") or {}
    if card.encoder_params.get("gpu_types"):
        # Its records come from typed clusters, which the retraining simulator does not build.
        raise ValueError("the model sees GPU types (encoder parameter gpu_types); retraining it is "
                         "not supported yet: train a new one with mlsched train dl2 --gpu-types")
    if "arch" not in arch or "hidden" not in arch:
        raise ValueError("the model card does not name the network's architecture (extras.architecture)")
    return SimpleNamespace(window=int(card.encoder_params["window"]), arch=arch["arch"],
                           hidden=tuple(int(h) for h in arch["hidden"]))


def load(path: str | Path, seed: int = 0) -> tuple[torch.nn.Module, ModelCard]:
    """(torch network with the graph's policy weights, the graph's card)."""
    path = Path(path)
    card = ModelCard.read(card_path(path))
    if card.algorithm != "dl2":
        raise ValueError(f"{path} is a {card.algorithm} model; this warm start rebuilds DL² networks")
    spec = network_args(card)
    torch.manual_seed(seed)
    net = networks.build(spec.arch, spec.window, spec.hidden)
    weights = {i.name[len(PREFIX):]: torch.from_numpy(np.array(numpy_helper.to_array(i), dtype=np.float32))
               for i in onnx.load(str(path)).graph.initializer if i.name.startswith(PREFIX)}
    own = net.state_dict()
    policy = [k for k in own if not k.startswith("value")]
    missing = [k for k in policy if k not in weights]
    if missing:
        raise ValueError(f"{path} lacks the weights {missing[:4]}: not exported by policy_models/dl2/export.py?")
    for k in policy:
        if tuple(weights[k].shape) != tuple(own[k].shape):
            raise ValueError(f"{path}: weight {k} has shape {tuple(weights[k].shape)}, the card's network "
                             f"{tuple(own[k].shape)}")
    net.load_state_dict({**own, **{k: weights[k] for k in policy}})
    return net, card
