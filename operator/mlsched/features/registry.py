"""Encoder name -> encoder. Learned policies register theirs here (imported on first use)."""

from __future__ import annotations

import importlib

from mlsched.features.base import Encoder

# name -> module that defines ENCODER; imported lazily so that a runtime without a learned
# policy's dependencies can still list the others.
_MODULES = {
    "dl2-state": "mlsched.features.dl2_state",
    "chic-state": "mlsched.features.chic_state",
    "harmony-state": "mlsched.features.harmony_state",
}


class UnknownEncoderError(ValueError):
    pass


def get(name: str) -> Encoder:
    module = _MODULES.get(name)
    if module is None:
        raise UnknownEncoderError(f"unknown state encoder {name!r}; this mlsched has "
                                  f"{', '.join(sorted(_MODULES))}")
    return importlib.import_module(module).ENCODER

