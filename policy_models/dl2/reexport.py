"""Rebuild a shipped DL² policy network from its ONNX file and export it again.

For when the export path changes but the trained weights should not (e.g. a faster graph for
the same function): the weights are read back from the ONNX initializers, the network is
exported anew, and the new file must give the same most probable action as the old one on
random states, with probabilities within TOLERANCE, before it replaces it. (The export parity
bound between torch and ONNX Runtime for one graph is 1e-5; a new graph may also sum in another
order, which on these random, far-from-realistic states moved probabilities by up to 1.5e-5.)
The card keeps its training record and gets the new digest and a note.

    python -m policy_models.dl2.reexport policy_models/artifacts/dl2/dl2.onnx
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from mlsched.features import dl2_state
from mlsched.policies.onnx_runner import load_model
from policy_models.dl2 import export, networks

TOLERANCE = 5e-5


def shared_from_onnx(path: Path, window: int, hidden: tuple[int, ...]) -> networks.SharedPolicy:
    graph = onnx.load(str(path)).graph
    weights = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    net = networks.SharedPolicy(window, hidden)
    state = net.state_dict()
    by_shape: dict[tuple, list[str]] = {}
    for name, value in weights.items():
        by_shape.setdefault(tuple(value.shape), []).append(name)
    for key in state:
        if key.startswith("value"):
            continue
        name = f"net.{key}"
        if name in weights:
            state[key] = torch.from_numpy(weights[name].copy())
            continue
        # The exporter stores some Linear weights transposed under generated names: match by
        # the transposed shape, which is unique per layer in this network.
        matches = by_shape.get(tuple(state[key].T.shape), [])
        if len(matches) != 1:
            raise ValueError(f"cannot find {key} in {path} (candidates {matches})")
        state[key] = torch.from_numpy(weights[matches[0]].T.copy())
    net.load_state_dict(state)
    return net


def main(argv: list[str]) -> int:
    path = Path(argv[0])
    old = load_model(path, kind="dl2")
    card = old.card.raw
    net = shared_from_onnx(path, card["window"], tuple(card["architecture"]["hidden"]))
    with tempfile.TemporaryDirectory() as tmp:
        new_path = Path(tmp) / path.name
        export.export_onnx(net, card["window"], new_path)
        rng = np.random.default_rng(0)
        state = rng.random((64, dl2_state.state_dim(card["window"])), dtype=np.float32)
        mask = (rng.random((64, dl2_state.n_actions(card["window"]))) < 0.5).astype(np.float32)
        mask[:, -1] = 1
        import onnxruntime as ort

        fresh = ort.InferenceSession(str(new_path), providers=["CPUExecutionProvider"])
        got = fresh.run(["probs"], {"state": state, "mask": mask})[0]
        want = old.probabilities(state, mask)
        err = float(np.abs(got - want).max())
        if err > TOLERANCE or (got.argmax(1) != want.argmax(1)).any():
            raise SystemExit(f"re-exported model differs by {err}; not replacing {path}")
        path.write_bytes(new_path.read_bytes())
    card["onnx_sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    card.setdefault("notes", []).append(f"re-exported from the trained weights with policy_models.dl2.reexport; "
                                        f"max probability difference {err:.1e}")
    path.with_name(path.stem + ".card.json").write_text(json.dumps(card, indent=2, sort_keys=True) + "\n")
    print(f"re-exported {path} (max difference {err:.1e})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
