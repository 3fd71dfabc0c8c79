"""Resource vectors: numpy arrays of (cpu, gpu, mem_gib), the order used everywhere."""

from __future__ import annotations

import numpy as np

RESOURCE_NAMES = ("cpu", "gpu", "mem_gib")
N_RESOURCES = len(RESOURCE_NAMES)


def resources(cpu: float = 0.0, gpu: float = 0.0, mem_gib: float = 0.0) -> np.ndarray:
    vec = np.array([cpu, gpu, mem_gib], dtype=np.float64)
    vec.setflags(write=False)
    return vec


DEFAULT_NODE_CAPACITY = resources(cpu=8, gpu=2, mem_gib=48)  # the DL² testbed server
