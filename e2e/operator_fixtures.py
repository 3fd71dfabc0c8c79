"""Fixtures of the operator tests: CRDs, the operator subprocess, the workload emulator, and
the label-nodes overlay's rights for the operators of the grouping tests (label_rights).

Each test gets its own namespace (conftest.py) and its own operator serving only that
namespace, so a test that kills or starves its operator cannot disturb another, and
each operator's log is that test's alone. The log is attached to the report of a
failed test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from controlplane import ControlPlane
from dl2_model import dl2_model_files
from mlsched_objects import REPO, MLSched, fresh_namespace, install_crds, load_yaml
from operator_identity import operator_kubeconfig, serve_namespace
from operator_process import OperatorProcess
from waiting import wait_for
from workload_emulator import WorkloadEmulator

#: Multiplies every policy's interval: 1200 s become 6 s rounds. The emulator runs
#: 1 / INTERVAL_SCALE simulated seconds per real second, so a round is one interval.
INTERVAL_SCALE = 0.005
TIME_SCALE = 1.0 / INTERVAL_SCALE
OPERATORS = pytest.StashKey[list[OperatorProcess]]()
# The label-nodes overlay's rights, which the grouping tests' operators run with (label_rights).
RBAC = REPO / "manifests" / "overlays" / "label-nodes" / "rbac-label-nodes.yaml"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for number, operator in enumerate(item.stash.get(OPERATORS, [])):
            report.sections.append((f"operator log #{number} ({operator.log_path})",
                                    operator.log_tail(200)))


@pytest.fixture(scope="session")
def crds(api):
    return install_crds(api)


@pytest.fixture(scope="session")
def operator_identity(control_plane: ControlPlane, api, tmp_path_factory) -> Path:
    """The kubeconfig the operator runs with: its own ServiceAccount and shipped RBAC."""
    return operator_kubeconfig(api, control_plane.apiserver_url, control_plane.ca_cert_path,
                               tmp_path_factory.mktemp("operator") / "operator.kubeconfig")


@pytest.fixture
def mlsched(api, namespace, crds) -> MLSched:
    return MLSched(api, namespace)


@pytest.fixture(scope="session")
def dl2_files(tmp_path_factory) -> tuple[Path, Path, str]:
    return dl2_model_files(tmp_path_factory.mktemp("dl2"))


@pytest.fixture
def start_operator(request: pytest.FixtureRequest, api, operator_identity: Path,
                   mlsched: MLSched, tmp_path: Path):
    """start_operator(**OperatorProcess kwargs) → a running operator for this test's
    namespace, which is set up as a served namespace of the namespaced install (the
    operator's RoleBinding, the training ServiceAccount). At teardown the test's MLJobs and
    policies are deleted, then their StatefulSets and pods (MLSched.delete_children), and
    the pods are waited out, so the next test finds the nodes empty."""
    started: list[OperatorProcess] = []
    request.node.stash[OPERATORS] = started
    serve_namespace(api, mlsched.namespace)

    def start(**kwargs) -> OperatorProcess:
        kwargs.setdefault("interval_scale", INTERVAL_SCALE)
        kwargs.setdefault("namespaces", [mlsched.namespace])
        operator = OperatorProcess(operator_identity, tmp_path / f"operator-{len(started)}.log",
                                   **kwargs)
        started.append(operator)
        operator.start()
        return operator

    yield start

    release(mlsched)
    for operator in started:
        operator.stop()
    mlsched.delete_children()
    wait_pods_gone(mlsched)


def release(mlsched: MLSched) -> None:
    """Deletes a namespace's MLJobs and policies. Nothing holds them (no finalizer), whether
    an operator runs or not."""
    mlsched.delete_all()
    wait_for(lambda: not mlsched.remaining(), 30, "the test's objects to be deleted",
             describe=mlsched.remaining)


def wait_pods_gone(mlsched: MLSched) -> None:
    wait_for(lambda: not mlsched.pods(), 90, "the test's pods to be garbage-collected",
             describe=lambda: [p.metadata.name for p in mlsched.pods()])


@pytest.fixture
def second_tenant(api, crds, start_operator) -> MLSched:
    """A second namespace, for what one tenant's objects may do to another's. It depends on
    start_operator so that its objects are released before the operator stops; the test
    starts an operator serving both: start_operator(namespaces=[mlsched.namespace,
    second_tenant.namespace])."""
    with fresh_namespace(api) as name:
        serve_namespace(api, name)
        tenant = MLSched(api, name)
        yield tenant
        release(tenant)
        tenant.delete_children()
        wait_pods_gone(tenant)


@pytest.fixture
def operator(start_operator) -> OperatorProcess:
    return start_operator()


@pytest.fixture
def emulator(control_plane: ControlPlane, mlsched: MLSched, tmp_path: Path):
    api_client = control_plane.api_client()
    emulator = WorkloadEmulator(api_client, [mlsched.namespace], tmp_path / "tokens",
                                time_scale=TIME_SCALE)
    emulator.start()
    yield emulator
    emulator.stop()
    api_client.close()


def own_nodes(api, control_plane: ControlPlane, count: int, prefix: str, label: str,
              value: str, **shape) -> Iterator[list[str]]:
    """For a fixture: `count` kwok nodes of a test's own (ControlPlane.create_nodes with
    `shape`), labelled `label=value` so that its operator's node selector keeps to them and
    the session's other nodes are left to the other tests; deleted afterwards."""
    core = client.CoreV1Api(api)
    names = control_plane.create_nodes(count, prefix=prefix, **shape)
    for name in names:
        core.patch_node(name, {"metadata": {"labels": {label: value}}})
    yield names
    for name in names:
        core.delete_node(name)


@pytest.fixture
def label_rights(api):
    """The label-nodes overlay's ClusterRole and binding, for this test only."""
    rbac = client.RbacAuthorizationV1Api(api)
    docs = load_yaml(RBAC)
    remove_rights(rbac, docs)  # left by an interrupted run
    for doc in docs:
        (rbac.create_cluster_role if doc["kind"] == "ClusterRole"
         else rbac.create_cluster_role_binding)(doc)
    yield
    remove_rights(rbac, docs)


def remove_rights(rbac, docs) -> None:
    for doc in docs:
        try:
            (rbac.delete_cluster_role if doc["kind"] == "ClusterRole"
             else rbac.delete_cluster_role_binding)(doc["metadata"]["name"])
        except client.exceptions.ApiException as err:
            if err.status != 404:
                raise
