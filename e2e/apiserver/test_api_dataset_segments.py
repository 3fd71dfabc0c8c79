"""What the retraining dataset's segment writes rest on (issue 55), on an API server alone (the
apiserver-only tier): optimistic concurrency on ConfigMaps, through the operator's own client.
The segments from the user's side, with the operator and jobs running, are in
e2e/test_operator_dataset_segments.py.
"""

from __future__ import annotations

from kubernetes import client

from mlsched.formats import dataset_store


def test_a_segment_write_from_a_stale_read_is_refused_and_the_retry_keeps_both(api, namespace):
    """What the segments' writes rest on, on the real API server and through the operator's own
    client: a merge patch carrying an old resourceVersion is refused with 409 (not applied over
    the newer write), and `dataset_segments.append` then reads again and keeps both records."""
    import asyncio

    from mlsched.controller.dataset import dataset_segments
    from mlsched.controller.kube.kube import ClientKubeApi, KubeError
    from mlsched.policies.decision_log import IntervalRecord

    def record(n: int) -> bytes:
        return IntervalRecord(namespace=namespace, policy="p", policy_uid="u", interval=n,
                              start="2026-01-01T00:00:00Z", end="2026-01-01T00:20:00Z",
                              length_s=1200, algorithms={}, nodes=1, reward=0.0).to_bytes()

    async def scenario() -> None:
        kube = ClientKubeApi(api_client=api)
        segs = dataset_segments.PolicySegments(namespace, "p")
        assert await dataset_segments.append(kube, segs, 0, record(0)) == 0
        stale = await kube.get("ConfigMap", namespace, "p-dataset-0")
        assert await dataset_segments.append(kube, segs, 1, record(1)) == 0  # the newer write
        try:
            await kube.patch("ConfigMap", namespace, "p-dataset-0", {
                "metadata": {"resourceVersion": stale["metadata"]["resourceVersion"]},
                "binaryData": {"interval-2.json.gz": ""}})
        except KubeError as err:
            assert err.status == 409, err
        else:
            raise AssertionError("a patch with a stale resourceVersion was applied")
        # Another process whose knowledge is that stale read: it reads again and appends.
        other = dataset_segments.PolicySegments(namespace, "p")
        assert await dataset_segments.append(kube, other, 2, record(2)) == 0

    asyncio.run(scenario())
    cm = client.ApiClient().sanitize_for_serialization(
        client.CoreV1Api(api).read_namespaced_config_map("p-dataset-0", namespace))
    assert dataset_store.segment_intervals(cm) == {0, 1, 2}
    assert [r.interval for r in dataset_store.read_records([cm])] == [0, 1, 2]
