"""The dataset's ConfigMap format: names, labels, splitting, and reading records back."""

from __future__ import annotations

import base64

import numpy as np

from mlsched.formats import dataset_store as store
from mlsched.policies.decision_log import DecisionRecorder, IntervalRecord, JobInterval
from builders import FakeCore


def record(interval: int = 7, policy: str = "default", steps: int = 3, state_dim: int = 8) -> IntervalRecord:
    rec = DecisionRecorder(algorithm="dl2", phase="allocation", kind="round",
                           time="2026-01-01T00:00:00Z", model_sha256="a" * 64, model_version="2",
                           encoder="dl2-state", encoder_version="v1", encoder_params={"window": 2},
                           epsilon=0.1)
    rng = np.random.default_rng(interval)
    for i in range(steps):
        rec.record(rng.random(state_dim), np.array([True, False, True]), i % 2, 0.9, 0.8, True, 0)
    job = JobInterval(name="bert", uid="u1", model_type="resnet-50", architecture="ParameterServer",
                      total_epochs=100, created="2026-01-01T00:00:00Z", ps=1, workers=2,
                      placement={"worker": ["n1", "n2"]}, epochs_at_start=3, epochs=2, reward=0.02)
    return IntervalRecord(namespace="team-a", policy=policy, policy_uid="pu", interval=interval,
                          start="2026-01-01T00:00:00Z", end="2026-01-01T00:20:00Z", length_s=1200,
                          algorithms={"allocation": "dl2"}, nodes=4, reward=0.02, jobs=[job],
                          decisions=[d for d in [rec.finish()] if d])


def test_names_labels_and_a_round_trip():
    r = record()
    (cm,) = store.manifests(r, store.CLOSED)
    meta = cm["metadata"]
    assert meta["name"] == "default-interval-7" and meta["namespace"] == "team-a"
    assert meta["labels"] == {"mlsched.io/dataset-of": "default", "mlsched.io/interval": "7",
                              "mlsched.io/part": "0", "mlsched.io/parts": "1",
                              "mlsched.io/record-state": "closed",
                              "app.kubernetes.io/managed-by": "mlsched-operator"}
    assert store.selector("default") == ("mlsched.io/dataset-of=default,"
                                         "app.kubernetes.io/managed-by=mlsched-operator")
    (back,) = store.read_records([cm])
    assert back.interval == 7 and back.jobs == r.jobs and back.reward == r.reward
    np.testing.assert_array_equal(back.decisions[0].actions, r.decisions[0].actions)


def test_a_large_record_is_split_and_reassembled_in_any_order():
    r = record(steps=400, state_dim=300)
    parts = store.manifests(r, store.CLOSED, size=20_000)
    assert len(parts) > 2
    assert [p["metadata"]["name"] for p in parts[:2]] == ["default-interval-7", "default-interval-7-1"]
    (back,) = store.read_records(list(reversed(parts)))
    assert back.decisions[0].steps == 400
    # A part missing, or parts of two different writes: the record is not half-read.
    assert store.read_records(parts[:-1]) == []
    newer = store.manifests(record(steps=401, state_dim=300), store.CLOSED, size=20_000)
    assert store.read_records([newer[0], *parts[1:]]) == []


def test_open_records_are_read_only_when_asked_and_ill_formed_ones_are_ignored():
    opened = store.manifests(record(interval=8), store.OPEN)
    closed = store.manifests(record(interval=7), store.CLOSED)
    junk = {"metadata": {"name": "x", "labels": {"mlsched.io/dataset-of": "default",
                                                 "mlsched.io/interval": "9", "mlsched.io/part": "0"},
                         "annotations": {"mlsched.io/policy": "default", "mlsched.io/sha256": "0"}},
            "binaryData": {"record.json.gz": base64.b64encode(b"not gzip").decode()}}
    unlabelled = {"metadata": {"name": "y"}, "data": {"a": "b"}}
    listed = [*opened, *closed, junk, unlabelled]
    assert [r.interval for r in store.read_records(listed)] == [7]
    assert [r.interval for r in store.read_records(listed, include_open=True)] == [7, 8]


def test_long_policy_names_are_shortened_consistently():
    long = "p" * 240
    name = store.configmap_name(long, 123456, 3)
    assert len(name) <= 253 and name.endswith("-interval-123456-3")
    label = store.policy_label(long)
    assert len(label) <= 63 and label == store.policy_label(long)
    assert store.policy_label(long) != store.policy_label(long[:-1] + "q")


def test_retention_keeps_the_newest():
    assert store.expired([5, 1, 3, 4, 2], 3) == [1, 2]
    assert store.expired([1, 2], 3) == []
    assert store.expired([1, 2], 0) == [1, 2]
    assert store.stored_intervals([{"metadata": {"name": "p-interval-3", "labels": {"mlsched.io/interval": "3"}}},
                                   {"metadata": {"name": "p-interval-3-1", "labels": {"mlsched.io/interval": "3"}}}]) \
        == {3: ["p-interval-3", "p-interval-3-1"]}


def test_list_records_pages_through_and_keeps_only_the_policy():
    items = [*store.manifests(record(interval=2), store.CLOSED),
             *store.manifests(record(interval=1), store.CLOSED)]
    core = FakeCore(items)
    records = store.list_records(core, "team-a", "default")
    assert [r.interval for r in records] == [1, 2] and len(core.calls) == 2
    assert core.calls[0][1] == store.selector("default")
