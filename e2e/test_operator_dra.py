"""Devices claimed through Dynamic Resource Allocation (resource.k8s.io/v1), on the real
control plane: a DeviceClass selecting a driver's GPUs by CEL, ResourceSlices publishing two
per node, and a ResourceClaimTemplate the workers name. kube-controller-manager makes one
ResourceClaim per pod and kube-scheduler allocates it a device on the node it picks, refusing
a node with none left ("cannot allocate all claims"). The operator counts the devices per
node like extended resources (controller/constraints/dra.py): tasks are placed where their devices are, at
once, and a job whose minimum the devices left cannot hold waits holding nothing and says why.

Found on the plane before: the workers' containers request 1 CPU and no GPU, so bin-packing
pinned them by CPU beyond the devices of their nodes; kube-scheduler refused them (`Displaced`
Events, an `Unschedulable` Warning)."""

from __future__ import annotations

import uuid

from kubernetes import client

from dra_objects import DRA, claim_template, claiming, published_devices
from job_state import placed_at_once, wait_all_running, waits_saying
from mlsched_objects import DAY, GROUP, IMAGE, KWOK_TOLERATION, VERSION, mljob, scheduling_policy
from node_fixtures import NODES, POOL, labelled, small_workers
from waiting import wait_for


def test_devices_claimed_through_dra_are_counted_per_node(api, mlsched, operator):
    core = client.CoreV1Api(api)
    with labelled(core, NODES, POOL, "yes"), published_devices(api, NODES, 2) as gpus:
        claim_template(api, mlsched.namespace, gpus)
        mlsched.create(scheduling_policy("default", interval=DAY, placement="bin-pack"))
        mlsched.create(claiming(mljob("dra-a", ps=None, workers=(6, 6))))
        pods = wait_all_running(mlsched, "dra-a", 6)
        per_node = sorted([p.spec.node_name for p in pods].count(n) for n in NODES)
        assert per_node == [2, 2, 2], [p.spec.node_name for p in pods]  # six on one node before
        placed_at_once(mlsched, "dra-a")
        # Every device of the three nodes is claimed: a second job waits and creates no pod.
        mlsched.create(claiming(mljob("dra-b", ps=None, workers=(2, 2))))
        message = waits_saying(mlsched, "dra-b", "device")
        assert (f"needs 2 worker pods taking 1 {gpus} device each; the 3 nodes it may use have "
                "room for 0 such pods now") in message, message
        # The first job deleted, its pods and then their claims go: the second one runs, long
        # before the day's round.
        mlsched.custom.delete_namespaced_custom_object(GROUP, VERSION, mlsched.namespace, "mljobs",
                                                       "dra-a")
        wait_all_running(mlsched, "dra-b", 2)
        placed_at_once(mlsched, "dra-b")


def test_gpus_claimed_through_dra_are_shared_by_drf_as_gpus(api, mlsched, start_operator):
    """--gpu-device-class: devices of the class are GPUs to the planner. Workers of dra-gpus
    claim one each and request 2 CPU; those of dra-cpus request 4 CPU. Seen as a CPU job,
    dra-gpus had half the other's dominant share per worker and DRF gave it 6 workers to 3;
    with its GPUs counted its share per worker is the larger of 2 CPU and 1 GPU of the
    cluster's, in step with the other's: 4 and 4."""
    core = client.CoreV1Api(api)
    with labelled(core, NODES, POOL, "yes"), published_devices(api, NODES, 2) as gpus:
        start_operator(extra_args=["--gpu-device-class", gpus])
        claim_template(api, mlsched.namespace, gpus)
        # A short interval (3 s here): whichever job is admitted first, a round soon decides
        # both together.
        mlsched.create(scheduling_policy("default", interval=600))
        mlsched.create(claiming(mljob("dra-gpus", ps=None, workers=(1, 6))))
        mlsched.create(small_workers(mljob("dra-cpus", ps=None, workers=(1, 6)), cpu="4"))

        def counts():
            return {j: len(mlsched.pods(j)) for j in ("dra-gpus", "dra-cpus")}

        wait_for(lambda: counts() == {"dra-gpus": 4, "dra-cpus": 4}, 90,
                 "DRF to give both jobs 4 workers (6 and 3 before)", describe=counts)
        wait_all_running(mlsched, "dra-gpus", 4)
        wait_all_running(mlsched, "dra-cpus", 4)


def test_devices_another_namespaces_pods_claim_are_held(api, mlsched, operator):
    """The e2e operator serves only the test's namespace (--namespace): another team's
    notebook claiming both devices of one node, in a namespace the operator does not watch
    with kopf, is seen through the claim watch of cluster_pods.py. Before, its claim was
    unseen: a gang of six was admitted onto four free devices, two pods stayed Pending."""
    core = client.CoreV1Api(api)
    other = f"e2e-other-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": other}})
    with labelled(core, NODES, POOL, "yes"), published_devices(api, NODES, 2) as gpus:
        try:
            claim_template(api, other, gpus, name="two-gpus", count=2)
            core.create_namespaced_pod(other, {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "notebook"},
                "spec": {"nodeSelector": {"kubernetes.io/hostname": NODES[0]},
                         "tolerations": [KWOK_TOLERATION],
                         "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "two-gpus"}],
                         "containers": [{"name": "c", "image": IMAGE,
                                         "resources": {"claims": [{"name": "gpu"}]}}]}})
            wait_for(lambda: core.read_namespaced_pod("notebook", other).status.phase == "Running",
                     60, "the other namespace's notebook to run")
            claim_template(api, mlsched.namespace, gpus)
            mlsched.create(scheduling_policy("default", interval=DAY, placement="bin-pack"))
            mlsched.create(claiming(mljob("dra-six", ps=None, workers=(6, 6))))
            message = waits_saying(mlsched, "dra-six", "device")
            assert (f"needs 6 worker pods taking 1 {gpus} device each; the 3 nodes it may use "
                    "have room for 4 such pods now") in message, message
            # The notebook gone, its claim goes with it: the gang runs, two per node.
            core.delete_namespaced_pod("notebook", other)
            pods = wait_all_running(mlsched, "dra-six", 6)
            per_node = sorted([p.spec.node_name for p in pods].count(n) for n in NODES)
            assert per_node == [2, 2, 2], [p.spec.node_name for p in pods]
            placed_at_once(mlsched, "dra-six")
        finally:
            core.delete_namespace(other)


def test_a_request_selecting_a_device_model_is_counted_by_its_selector(api, mlsched, operator):
    """A template picking one GPU model with its request's own selector (the way MIG profiles
    and GPU models are asked for): each node publishes one h100 and one a100. Before, such a
    request counted nothing: bin-packing pinned the three h100 workers to one node, two were
    refused (`Displaced`, `Unschedulable`)."""
    core = client.CoreV1Api(api)
    with labelled(core, NODES, POOL, "yes"), published_devices(api, NODES, 2, ("h100", "a100")) as gpus:
        h100 = f"device.attributes['{gpus}'].model == 'h100'"
        claim_template(api, mlsched.namespace, gpus, name="one-h100", selector=h100)
        mlsched.create(scheduling_policy("default", interval=DAY, placement="bin-pack"))
        mlsched.create(claiming(mljob("dra-h100", ps=None, workers=(3, 3)), template="one-h100"))
        pods = wait_all_running(mlsched, "dra-h100", 3)
        assert sorted(p.spec.node_name for p in pods) == NODES, [p.spec.node_name for p in pods]
        placed_at_once(mlsched, "dra-h100")
        # Every h100 is claimed, three a100s are free: a job asking an h100 waits, no pod.
        mlsched.create(claiming(mljob("dra-h100-b", ps=None, workers=(1, 1)), template="one-h100"))
        message = waits_saying(mlsched, "dra-h100-b", "device")
        assert (f"needs 1 worker pods taking 1 {gpus}[{gpus}/model='h100'] device each; the 3 nodes "
                "it may use have room for 0 such pods now") in message, message


def test_devices_of_a_claim_its_pod_no_longer_uses_are_handed_out(api, mlsched, operator):
    """A ResourceClaim made by hand (`resourceClaimName`, not from a template) outlives the
    pod that used it: when the pod completes, kube-controller-manager takes the claim's
    reservation and allocation back and the claim stays. Its devices are free then; before,
    the claim stayed allocated in the operator's index until deleted, and a job waiting for
    those devices waited for good."""
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    ns = mlsched.namespace
    with labelled(core, NODES, POOL, "yes"), published_devices(api, NODES, 2) as gpus:
        custom.create_namespaced_custom_object(*DRA, ns, "resourceclaims", {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "notebook-gpus", "namespace": ns},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": gpus, "count": 2}}]}}})
        core.create_namespaced_pod(ns, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "notebook"},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": NODES[0]},
                     "tolerations": [KWOK_TOLERATION], "restartPolicy": "Never",
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": "notebook-gpus"}],
                     "containers": [{"name": "c", "image": IMAGE,
                                     "resources": {"claims": [{"name": "gpu"}]}}]}})
        wait_for(lambda: core.read_namespaced_pod("notebook", ns).status.phase == "Running",
                 60, "the notebook to run")
        claim_template(api, ns, gpus)
        mlsched.create(scheduling_policy("default", interval=DAY, placement="bin-pack"))
        mlsched.create(claiming(mljob("dra-six", ps=None, workers=(6, 6))))
        message = waits_saying(mlsched, "dra-six", "device")
        assert "have room for 4 such pods now" in message, message
        core.patch_namespaced_pod_status("notebook", ns, {"status": {"phase": "Succeeded"}})

        def deallocated() -> bool:
            claim = custom.get_namespaced_custom_object(*DRA, ns, "resourceclaims", "notebook-gpus")
            return not (claim.get("status") or {}).get("allocation")
        wait_for(deallocated, 60, "kube-controller-manager to deallocate the notebook's claim")
        pods = wait_all_running(mlsched, "dra-six", 6)
        assert sorted([p.spec.node_name for p in pods].count(n) for n in NODES) == [2, 2, 2]
