"""The shipped manifests as a user installs them, on an API server alone (the apiserver-only
tier): what needs no controller, no node and no operator.

1. `kubectl apply --server-side` of the rendered `dev` overlay (CRDs, RBAC, the model
   ConfigMaps, the Deployment, the namespace mlsched-dev with its `default` policy), a second
   time if the first came too early for the SchedulingPolicy's CRD, as the README says
   (the `dev` fixture of e2e/dev_overlay.py).
2. Every overlay, the samples and the per-namespace kustomizations, rendered and sent as a
   server-side dry run with strict field validation: the built-in kinds against the API
   server's own schemas of the Kubernetes version we test on (1.34), the custom resources
   against the installed CRDs. Unknown fields are errors, not silently pruned.

This module starts an ApiServerPlane of its own, as e2e/test_deploy_manifests.py starts a full
plane of its own: the dev overlay binds the operator cluster-wide and installs the CRDs itself.
The operator under the overlay's RBAC and the README's install and uninstall stay there (they
need pods, and KCM's namespace controller).
"""

from __future__ import annotations

import base64

import pytest
import yaml
from kubernetes import client

from controlplane import ApiServerPlane
from dev_overlay import DEV_NAMESPACE, MANIFESTS, find, render
from mlsched_objects import REPO, MLSched, default_policy
from operator_identity import NAMESPACE
from plane_fixture import running_plane


#: Every kustomization a user applies, and the namespace `-n` names for those without one.
RENDERED = {
    "manifests": (MANIFESTS, None),
    "overlays/dev": (MANIFESTS / "overlays" / "dev", None),
    "overlays/prod": (MANIFESTS / "overlays" / "prod", None),
    "overlays/namespaced": (MANIFESTS / "overlays" / "namespaced", None),
    "overlays/label-nodes": (MANIFESTS / "overlays" / "label-nodes", None),
    "overlays/namespaced/served-namespace":
        (MANIFESTS / "overlays" / "namespaced" / "served-namespace", DEV_NAMESPACE),
    "base/training-namespace": (MANIFESTS / "base" / "training-namespace", DEV_NAMESPACE),
    "samples": (MANIFESTS / "samples", DEV_NAMESPACE),
}


@pytest.fixture(scope="module")
def cluster():
    yield from running_plane(ApiServerPlane(), lambda p: None)


@pytest.fixture(scope="module")
def api(cluster):
    api_client = cluster.api_client()
    yield api_client
    api_client.close()


def test_dev_overlay_installs_on_a_fresh_cluster(cluster, api, dev):
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    deployment = apps.read_namespaced_deployment("mlsched-operator", NAMESPACE)
    container = deployment.spec.template.spec.containers[0]
    assert deployment.spec.replicas == 1 and container.image == "mlsched-operator:dev"
    assert "--verbose" in container.args
    # The policy MLJobs without one use, in the namespace made for jobs.
    policy = MLSched(api, DEV_NAMESPACE).policy("default")
    assert policy["spec"]["allocation"] == "drf"
    # The model ConfigMaps hold the shipped files byte for byte.
    for volume in deployment.spec.template.spec.volumes:
        for source in (volume.projected.sources if volume.projected else ()):
            config_map = core.read_namespaced_config_map(source.config_map.name, NAMESPACE)
            folder = volume.name.removeprefix("models-")
            for key, value in (config_map.binary_data or {}).items():
                shipped = REPO / "policy_models" / "artifacts" / folder / key
                assert base64.b64decode(value) == shipped.read_bytes(), key
            for key, value in (config_map.data or {}).items():
                assert value == (REPO / "policy_models" / "artifacts" / folder / key).read_text()


@pytest.mark.parametrize("name", RENDERED)
def test_every_kustomization_validates_strictly_on_the_apiserver(cluster, dev, name, tmp_path):
    directory, namespace = RENDERED[name]
    path = tmp_path / "rendered.yaml"
    path.write_text(yaml.safe_dump_all(render(cluster, directory)))
    args = ["apply", "--server-side", "--force-conflicts", "--dry-run=server",
            "--validate=strict", "-f", str(path)]
    result = cluster.kubectl(*args, *(["-n", namespace] if namespace else []), check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "(server dry run)" in result.stdout


def test_strict_validation_refuses_an_unknown_field(cluster, dev, tmp_path):
    """The check above can fail: a misspelt field in a built-in kind and in a custom resource."""
    objects = render(cluster, MANIFESTS / "overlays" / "prod")
    deployment = find(objects, "Deployment", "mlsched-operator")
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    policy = default_policy()
    policy["spec"]["alocation"] = "drf"
    for obj, namespace, field in ((deployment, NAMESPACE, "imagePullPolicyy"),
                                  (policy, DEV_NAMESPACE, "spec.alocation")):
        path = tmp_path / f"{obj['kind']}.yaml"
        path.write_text(yaml.safe_dump(obj))
        result = cluster.kubectl("apply", "--server-side", "--dry-run=server", "--validate=strict",
                                 "-n", namespace, "-f", str(path), check=False)
        assert result.returncode != 0, result.stdout
        assert f"{field}: field not declared in schema" in result.stderr, result.stderr
