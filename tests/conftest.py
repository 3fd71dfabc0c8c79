"""Shared helpers for the fast tests: tiny snapshots and jobs built by hand."""

from __future__ import annotations

import numpy as np
import pytest

from mlsched.cluster.types import JobView, Snapshot


def make_snapshot(jobs: list[JobView], nodes: int = 4, cpu: float = 8, gpu: float = 2,
                  mem: float = 48) -> Snapshot:
    cap = np.tile(np.array([cpu, gpu, mem], dtype=float), (nodes, 1))
    return Snapshot(0.0, 1200.0, [f"n{i}" for i in range(nodes)], cap, jobs)


def job(name: str, model: str = "resnet-50", arrival: float = 0.0, epochs: float = 100.0,
        done: float = 0.0, arch: str = "ps", **kw) -> JobView:
    return JobView(name=name, model=model, arch=arch, arrival_s=arrival, total_epochs=epochs,
                   epochs_done=done, min_ps=1 if arch == "ps" else 0, **kw)


@pytest.fixture
def snapshot_factory():
    return make_snapshot


# The tiers (`make test`): `-m "not training and not figures"` is the fast tier, `-m "training
# or figures"` the modules that train or run torch networks (each marks itself with this line,
# pyproject.toml registers the markers) and the whole-simulation figure checks. A deselected
# module is still imported to be collected, and importing torch costs each xdist worker
# seconds, so the fast tier does not collect the training modules at all.
FAST_TIERS = {"nottraining", "nottrainingandnotfigures"}
TRAINING_MODULE = "\npytestmark = pytest.mark.training\n"


def pytest_ignore_collect(collection_path, config):
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    if config.getoption("markexpr", "").replace(" ", "") not in FAST_TIERS:
        return None
    return True if TRAINING_MODULE in collection_path.read_text(encoding="utf-8") else None
