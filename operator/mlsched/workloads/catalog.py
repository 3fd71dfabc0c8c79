"""The model catalog: the eight models measured by the DL² authors and their constants.

Constants come from the DL² simulator's job templates (research digest seed-dl2.md §6): global
batch, model size, local compute time per step, steps per epoch, inter/intra-node bandwidth,
and per-task resource demands (a worker needs 2 CPUs and 1 GPU, except the two text models
whose workers are CPU-only; every PS needs 2 CPUs). Memory demands are not in DL²; we use the
Chic paper's figures (8-10 GB per task) so that memory is a real but rarely binding constraint.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlsched.workloads.resources import resources


@dataclass(frozen=True)
class ModelProfile:
    name: str
    domain: str
    dataset: str
    global_batch: int
    model_size_mb: float
    local_compute_s: float  # one step on one worker, DL² constant
    steps_per_epoch: int
    bw_inter_mbps: float  # MB/s between nodes (DL² constant)
    bw_intra_mbps: float  # MB/s inside a node
    worker_demand: np.ndarray  # (cpu, gpu, mem_gib)
    ps_demand: np.ndarray

    def demand(self, role: str) -> np.ndarray:
        return self.ps_demand if role == "ps" else self.worker_demand


def _gpu_worker(mem: float) -> np.ndarray:
    return resources(cpu=2, gpu=1, mem_gib=mem)


def _cpu_worker(mem: float) -> np.ndarray:
    return resources(cpu=2, gpu=0, mem_gib=mem)


_PS = resources(cpu=2, gpu=0, mem_gib=8)

MODELS: dict[str, ModelProfile] = {
    p.name: p
    for p in (
        ModelProfile("resnet-50", "image classification", "ImageNet", 32, 102.2, 0.449, 115,
                     91.875, 306.5, _gpu_worker(8), _PS),
        ModelProfile("vgg-16", "image classification", "ImageNet", 32, 553.4, 0.535, 115,
                     233.0, 427.75, _gpu_worker(10), _PS),
        ModelProfile("resnext-110", "image classification", "CIFAR10", 128, 6.92, 0.226, 390,
                     59.5, 63.0, _gpu_worker(10), _PS),
        ModelProfile("inception-bn", "image classification", "Caltech", 128, 42.1, 0.815, 120,
                     145.875, 1082.125, _gpu_worker(8), _PS),
        ModelProfile("seq2seq", "machine translation", "WMT17", 64, 36.5, 0.075, 780,
                     120.125, 181.125, _gpu_worker(8), _PS),
        ModelProfile("cnn-text-classification", "sentence classification", "mr", 50, 24.0,
                     0.585, 193, 60.75, 159.625, _cpu_worker(6), _PS),
        ModelProfile("dssm", "word representation", "text8", 256, 6.0, 0.567, 349,
                     92.125, 65.625, _cpu_worker(6), _PS),
        ModelProfile("wlm", "language model", "PTB", 160, 19.2, 0.154, 165,
                     10.375, 22.875, _gpu_worker(6), _PS),
    )
}

ALIASES = {"ctc": "cnn-text-classification"}

#: Canonical model names in a fixed order.
MODEL_NAMES: tuple[str, ...] = tuple(MODELS)


class UnknownModelError(ValueError):
    pass


def canonical_name(name: str) -> str:
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in MODELS:
        known = ", ".join(list(MODELS) + list(ALIASES))
        raise UnknownModelError(f"unknown model {name!r}; known models: {known}")
    return key


def is_known(name: str) -> bool:
    """Is `name` (or an alias) a catalog model? Other names are fine for jobs; they just get
    generic priors and cannot be simulated."""
    key = name.strip().lower()
    return ALIASES.get(key, key) in MODELS


def get(name: str) -> ModelProfile:
    return MODELS[canonical_name(name)]
