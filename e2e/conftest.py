"""Fixtures for the e2e tier: one real control plane per test session.

A missing Go toolchain, a failed build or a component that will not start makes
the tests error with what to install or which log to read; they never skip,
because a skipped e2e tier would look like a passing one.

The operator tests add (see operator_fixtures.py): the CRDs, an operator
subprocess per test serving only that test's namespace, the workload emulator,
and a DL² model.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import pytest
from kubernetes import client

from controlplane import ControlPlane
from plane_fixture import install_crds_first, running_plane
from mlsched_objects import fresh_namespace

# The operator's fixtures live in their own module; importing them here registers
# them (pytest_plugins is only allowed in a rootdir conftest).
from operator_fixtures import (  # noqa: E402,F401
    crds, dl2_files, emulator, label_rights, mlsched, operator, operator_identity,
    pytest_runtest_makereport, second_tenant, start_operator,
)
# Fixtures of two modules each, one of them in the apiserver tier: the promtool build and the
# dev overlay installed on the asking module's own plane.
from monitoring_manifests import tools  # noqa: E402,F401
from dev_overlay import dev  # noqa: E402,F401


# The full plane runs on three pytest-xdist workers, each with a plane of its own, a module to
# a worker (`--dist loadfile --no-loadscope-reorder`, docs/e2e.md "Three planes at once"), so a
# module's tests run in order and its module fixtures are made once. A worker takes the next
# module when it is free, so the longest go first: begun last, one of them would run on alone
# at the end. Seconds per module measured on three workers on 30 Nov 2026 (`--junitxml`); every
# module not named takes under 60 s and keeps its place.
# The two modules whose "pods" are local processes on this machine's network (pod_runner.py)
# may run at once: their jobs listen on different ports (test_operator_training.py).
LONGEST_MODULES_FIRST = (
    "test_operator_training",          # 186 s: the reference programs trained in pods
    "test_reference_programs",         # 142 s
    "test_operator_unschedulable",     # 134 s
    "test_operator_leader_election",   # 110 s
    "test_operator_faults",            # 98 s
    "test_retraining_harmony",         # 94 s
    "test_operator_retraining_records",  # 81 s
    "test_operator_records",           # 80 s
    "test_operator_status_burst",      # 80 s
    "test_retraining_loop",            # 80 s
    "test_operator_admission",         # 63 s
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_MODULES_FIRST)}
    # sort is stable: the other modules, and the tests within a module, keep their order.
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))


@dataclass(frozen=True)
class NodeShape:
    """The fake nodes every session starts with (named kwok-node-0, -1, ...)."""
    count: int = 13
    cpu: int = 8
    gpu: int = 2
    memory_gib: int = 48


SESSION_NODES = NodeShape()


@pytest.fixture(scope="session")
def node_shape() -> NodeShape:
    return SESSION_NODES


@pytest.fixture(scope="session")
def control_plane(request: pytest.FixtureRequest):
    plane = ControlPlane(before_controllers=install_crds_first)
    # A cold build takes about 13 minutes on 2 cores; show its progress instead
    # of letting pytest swallow it.
    capture = request.config.pluginmanager.getplugin("capturemanager")
    live_output = capture.global_and_fixture_disabled() if capture else contextlib.nullcontext()
    yield from running_plane(plane, lambda p: p.create_nodes(
        SESSION_NODES.count, cpu=SESSION_NODES.cpu, gpu=SESSION_NODES.gpu,
        memory_gib=SESSION_NODES.memory_gib), live_output)


@pytest.fixture(scope="session")
def api(control_plane: ControlPlane):
    """An admin ApiClient for the session."""
    api_client = control_plane.api_client()
    yield api_client
    api_client.close()


@pytest.fixture
def namespace(api: client.ApiClient):
    """A fresh namespace per test, so tests cannot see each other's objects."""
    with fresh_namespace(api) as name:
        yield name
