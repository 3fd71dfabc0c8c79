"""A real DL² ONNX model with its model card, and the ConfigMap or directory that serves it.

The shipped artifact (policy_models/artifacts/dl2/) is used when it exists. A fresh
checkout may not have one (training it takes hours), so otherwise a small untrained
network is exported with the same exporter the trainer uses: its card and graph pass
every check the operator makes, which is what these tests are about, not the quality
of its decisions. The seed makes its decisions the same on every run.
"""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

from mlsched_objects import REPO

ARTIFACT = REPO / "policy_models" / "artifacts" / "dl2" / "dl2.onnx"
MODEL_KEY, CARD_KEY = "policy.onnx", "policy.card.json"  # as in schedulingpolicy-dl2.yaml
SEED = 0


def card_of(model: Path) -> Path:
    return model.with_name(model.stem + ".card.json")


def dl2_model_files(directory: Path) -> tuple[Path, Path, str]:
    """(model, card, where it came from) in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    model = directory / "dl2.onnx"
    if ARTIFACT.is_file() and card_of(ARTIFACT).is_file():
        shutil.copy(ARTIFACT, model)
        shutil.copy(card_of(ARTIFACT), card_of(model))
        return model, card_of(model), f"shipped artifact {ARTIFACT}"
    try:
        import torch

        from policy_models.dl2 import export, networks, train
    except ImportError as err:
        raise RuntimeError(
            f"no {ARTIFACT} and cannot export a test model ({err}): install the dev extras, "
            "`pip install -e '.[dev]'` (torch, onnx)") from None
    torch.manual_seed(SEED)
    net = networks.build("shared", 40, (32, 32))
    export.export(net, train.Args(hidden=(32, 32)), model, "test", {}, {})
    return model, card_of(model), f"untrained shared(32, 32) network, seed {SEED}"


def model_configmap(name: str, model: Path, card: Path) -> dict:
    """What `kubectl create configmap NAME --from-file=policy.onnx=... --from-file=
    policy.card.json=...` creates: binary model in binaryData, the JSON card in data."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
            "binaryData": {MODEL_KEY: base64.b64encode(model.read_bytes()).decode()},
            "data": {CARD_KEY: card.read_text()}}


def corrupt_configmap(name: str, card: Path) -> dict:
    """A model damaged in transit: garbage bytes where the ONNX graph should be, next to
    the genuine card (whose digest they no longer match)."""
    garbage = bytes(range(256)) * 16
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
            "binaryData": {MODEL_KEY: base64.b64encode(garbage).decode()},
            "data": {CARD_KEY: card.read_text()}}


def stale_card_configmap(name: str, model: Path, card: Path) -> dict:
    """The genuine model next to a card that says it was trained with an older state
    encoder: a card the operator must refuse, for bytes another tenant serves fine."""
    stale = json.loads(card.read_text())
    stale["encoder"]["version"] = "dl2-state-v0"
    return {**model_configmap(name, model, card), "data": {CARD_KEY: json.dumps(stale)}}


def configmap_ref(name: str) -> dict:
    return {"configMapKeyRef": {"name": name, "key": MODEL_KEY}}


def path_ref(path: Path | str) -> dict:
    return {"path": str(path)}


def model_directory(directory: Path, model: Path, card: Path) -> Path:
    """A model directory for the operator (--allowed-model-dir) holding the model and its
    card, as a volume mounted into its pod would; returns the model's path there."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(model, directory / model.name)
    shutil.copy(card, card_of(directory / model.name))
    return directory / model.name
