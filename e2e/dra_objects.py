"""Devices for Dynamic Resource Allocation (resource.k8s.io/v1) on the session's shared plane:
a DeviceClass and ResourceSlices published as a DRA driver would, ResourceClaimTemplates, and
workers that claim a device through one."""

from __future__ import annotations

import contextlib
import uuid

from kubernetes import client

from node_fixtures import small_workers

DRA = ("resource.k8s.io", "v1")


@contextlib.contextmanager
def published_devices(api: client.ApiClient, nodes: list[str], per_node: int,
                      models: tuple[str, ...] = ()):
    """A DeviceClass of its own driver's GPUs and a ResourceSlice per node publishing
    `per_node` of them, as a DRA driver's kubelet plugin would (device i with the `model`
    attribute models[i % len(models)], if given); removed afterwards (they are cluster-scoped,
    on the session's shared plane). Yields the class's name."""
    custom = client.CustomObjectsApi(api)
    driver = f"gpu-{uuid.uuid4().hex[:6]}.e2e.mlsched.io"
    custom.create_cluster_custom_object(*DRA, "deviceclasses", {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": driver},
        "spec": {"selectors": [{"cel": {"expression":
                 f"device.driver == '{driver}' && device.attributes['{driver}'].type == 'gpu'"}}]}})
    slices = []
    try:
        for node in nodes:
            name = f"{node}-{driver}"
            custom.create_cluster_custom_object(*DRA, "resourceslices", {
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
                "spec": {"driver": driver, "nodeName": node,
                         "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                         "devices": [{"name": f"gpu-{i}", "attributes": {
                             "type": {"string": "gpu"},
                             **({"model": {"string": models[i % len(models)]}} if models else {})}}
                                     for i in range(per_node)]}})
            slices.append(name)
        yield driver
    finally:
        for name in slices:
            custom.delete_cluster_custom_object(*DRA, "resourceslices", name)
        custom.delete_cluster_custom_object(*DRA, "deviceclasses", driver)


def claim_template(api: client.ApiClient, namespace: str, device_class: str, name: str = "one-gpu",
                   count: int = 1, selector: str | None = None) -> None:
    exactly = {"deviceClassName": device_class, "count": count,
               **({"selectors": [{"cel": {"expression": selector}}]} if selector else {})}
    client.CustomObjectsApi(api).create_namespaced_custom_object(*DRA, namespace, "resourceclaimtemplates", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}})


def claiming(job: dict, template: str = "one-gpu") -> dict:
    spec = small_workers(job, cpu="1")["spec"]["replicaSpecs"]["worker"]["template"]["spec"]
    spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
    spec["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    return job
