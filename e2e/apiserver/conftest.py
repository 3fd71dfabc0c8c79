"""The apiserver-only tier: etcd and kube-apiserver, with the CRDs of crds/, as envtest runs them.

What is tested here needs only the API server's own work: the CRDs' schemas and CEL rules,
strict field validation, server-side dry runs of the shipped manifests, defaulting, RBAC and
SubjectAccessReviews, the status subresource. No kube-controller-manager, no scheduler, no kwok
nodes (controlplane.ApiServerPlane says what that leaves out): a test that needs a pod, a node
running pods or the operator acting on them belongs in the full tier, e2e/test_*.py. An
operator may run here (the `operator` fixture works) when what it is tested for is status it
writes without any pod, such as a job told that a RuntimeClass it names does not exist, or a
policy's model conditions and decided counts over Node objects the test writes with a Ready
condition (test_api_models.py: nothing runs pods on them).

This conftest overrides the session fixtures of e2e/conftest.py and operator_fixtures.py that
stand on the plane (`control_plane`, `api`, `crds`, `operator_identity`), so `namespace`,
`mlsched` and the rest resolve to this plane for the tests below this directory, and to the
full one elsewhere, in one run or two. Every test here is marked `apiserver`
(`pytest -m apiserver e2e`, `make test-api`). The plane's start-up is printed (target: under
10 s once the binaries are built).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from controlplane import ApiServerPlane
from mlsched_objects import install_crds
from operator_identity import operator_kubeconfig
from plane_fixture import running_plane

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.apiserver)


@pytest.fixture(scope="session")
def control_plane(request: pytest.FixtureRequest):
    plane = ApiServerPlane()
    capture = request.config.pluginmanager.getplugin("capturemanager")

    def live_output() -> contextlib.AbstractContextManager:
        return capture.global_and_fixture_disabled() if capture else contextlib.nullcontext()

    for started in running_plane(plane, lambda p: None, live_output()):
        with live_output():
            print(f"\napiserver-only plane (etcd + kube-apiserver) up in {started.startup_s:.1f} s")
        yield started


@pytest.fixture(scope="session")
def api(control_plane: ApiServerPlane):
    """An admin ApiClient for this tier's session."""
    api_client = control_plane.api_client()
    yield api_client
    api_client.close()


@pytest.fixture(scope="session")
def crds(api):
    return install_crds(api)


@pytest.fixture(scope="session")
def operator_identity(control_plane: ApiServerPlane, api, tmp_path_factory) -> Path:
    """The operator's kubeconfig (its ServiceAccount, the shipped RBAC), on this plane."""
    return operator_kubeconfig(api, control_plane.apiserver_url, control_plane.ca_cert_path,
                               tmp_path_factory.mktemp("operator") / "operator.kubeconfig")
