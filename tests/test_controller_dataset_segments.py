"""The dataset's segments (controller/dataset/dataset_segments.py, dataset_store.py): closed records many
to a ConfigMap, filled and rolled over, written conditionally on the resourceVersion read (a
concurrent writer is never lost), pruned by retention, and datasets from before segments still
read, continued and expired. Against the in-memory API (which refuses a stale resourceVersion
as the API server does)."""

from __future__ import annotations

import base64
import logging

import pytest

from mlsched.controller.dataset import dataset_segments as segments
from mlsched.formats import dataset_store as store
from mlsched.policies.decision_log import IntervalRecord, JobInterval
from memory_kube import MemoryKube
from controller_steps import dataset_records as records, dataset_setup as setup, \
    dataset_step as step, report_epochs as report
from builders import NOW, NS, make_runtime, run


def record(interval: int, policy: str = "default", note: str = "") -> IntervalRecord:
    job = JobInterval(name="a", uid="u", model_type="resnet-50", architecture="ParameterServer",
                      total_epochs=100, created="2026-01-01T00:00:00Z", ps=1, workers=2,
                      placement={"worker": ["n1"]}, epochs_at_start=0, epochs=1, reward=0.01)
    return IntervalRecord(namespace=NS, policy=policy, policy_uid="pu" + note, interval=interval,
                          start="2026-01-01T00:00:00Z", end="2026-01-01T00:20:00Z", length_s=1200,
                          algorithms={"allocation": "drf"}, nodes=4, reward=0.01, jobs=[job])


def segment_names(kube: MemoryKube) -> list[str]:
    return sorted(c["metadata"]["name"] for c in kube.of_kind("ConfigMap") if store.is_segment(c))


def intervals_by_segment(kube: MemoryKube) -> dict[str, list[int]]:
    return {c["metadata"]["name"]: sorted(store.segment_intervals(c))
            for c in kube.of_kind("ConfigMap") if store.is_segment(c)}


ONE = len(record(0).to_bytes()) + len(store.segment_key(0))  # what one small record takes


# ---- filling and rolling --------------------------------------------------------------------
def test_segments_fill_up_to_the_limit_then_the_next_one_starts():
    kube = MemoryKube()
    segs = segments.PolicySegments(NS, "default")
    limit = 3 * ONE + 10  # room for three records, not four
    numbers = [run(segments.append(kube, segs, n, record(n).to_bytes(), limit)) for n in range(7)]
    assert numbers == [0, 0, 0, 1, 1, 1, 2]
    assert intervals_by_segment(kube) == {"default-dataset-0": [0, 1, 2],
                                          "default-dataset-1": [3, 4, 5], "default-dataset-2": [6]}
    for cm in kube.of_kind("ConfigMap"):
        meta = cm["metadata"]
        assert store.segment_bytes(cm) <= limit
        assert meta["labels"] == {"mlsched.io/dataset-of": "default",
                                  "mlsched.io/dataset-segment": meta["name"].rsplit("-", 1)[1],
                                  "app.kubernetes.io/managed-by": "mlsched-operator"}
        # The annotation names the keys: what a metadata-only list (retention) sees.
        assert store.parse_ranges(meta["annotations"]["mlsched.io/intervals"]) == \
            store.segment_intervals(cm)
    assert [r.interval for r in store.read_records(kube.of_kind("ConfigMap"))] == list(range(7))
    # Written again (a retry whose answer was lost): kept as it is, nothing written.
    writes = len(kube.writes())
    assert run(segments.append(kube, segs, 4, record(4, note="x").to_bytes(), limit)) == 1
    assert len(kube.writes()) == writes
    assert {r.interval: r.policy_uid for r in store.read_records(kube.of_kind("ConfigMap"))}[4] == "pu"


def test_a_process_that_knows_nothing_finds_the_newest_segment_by_trying():
    """A writer whose listing is stale (a second process): segment 0 exists and is full, so its
    create of segment 0 is refused; it reads it, finds it full and goes on to segment 1."""
    kube = MemoryKube()
    limit = 2 * ONE + 10
    first = segments.PolicySegments(NS, "default")
    for n in range(3):
        run(segments.append(kube, first, n, record(n).to_bytes(), limit))
    stale = segments.PolicySegments(NS, "default")
    assert run(segments.append(kube, stale, 3, record(3).to_bytes(), limit)) == 1
    assert intervals_by_segment(kube) == {"default-dataset-0": [0, 1], "default-dataset-1": [2, 3]}


def test_a_configmap_of_someone_else_under_a_segments_name_is_left_alone():
    kube = MemoryKube()
    kube.put({"apiVersion": "v1", "kind": "ConfigMap", "data": {"mine": "yes"},
              "metadata": {"name": "default-dataset-0", "namespace": NS}})
    segs = segments.PolicySegments(NS, "default")
    assert run(segments.append(kube, segs, 0, record(0).to_bytes())) == 1
    assert kube.obj("ConfigMap", NS, "default-dataset-0")["data"] == {"mine": "yes"}
    assert run(segments.append(kube, segs, 1, record(1).to_bytes())) == 1


# ---- conflicts ------------------------------------------------------------------------------
class Interloper(MemoryKube):
    """Another writer appends to the segment between our read and our write, `times` times."""

    def __init__(self, times: int = 1, size: int = 0):
        super().__init__()
        self.times, self.size = times, size
        self.conflicts = 0

    async def patch(self, kind, namespace, name, patch, **kw):
        if self.times and isinstance(patch, dict) and "resourceVersion" in patch.get("metadata", {}):
            self.times -= 1
            n = 1000 + self.times
            theirs = record(n).to_bytes() + b"\0" * self.size  # not a record once padded: no matter
            await super().patch(kind, namespace, name, {
                "metadata": {"annotations": {store.INTERVALS: "ignored"}},
                "binaryData": {store.segment_key(n): base64.b64encode(theirs).decode()}})
            try:
                return await super().patch(kind, namespace, name, patch, **kw)
            except Exception:
                self.conflicts += 1
                raise
        return await super().patch(kind, namespace, name, patch, **kw)


def test_a_conflicting_write_is_read_again_and_neither_is_lost():
    kube = Interloper(times=1)
    segs = segments.PolicySegments(NS, "default")
    run(segments.append(kube, segs, 0, record(0).to_bytes()))
    assert run(segments.append(kube, segs, 1, record(1).to_bytes())) == 0
    assert kube.conflicts == 1
    cm = kube.obj("ConfigMap", NS, "default-dataset-0")
    assert store.segment_intervals(cm) == {0, 1, 1000}  # theirs and ours
    assert store.parse_ranges(cm["metadata"]["annotations"][store.INTERVALS]) == {0, 1, 1000}


def test_a_conflicting_writer_that_filled_the_segment_sends_ours_to_the_next():
    limit = 3 * ONE
    kube = Interloper(times=1, size=ONE)  # their record takes the room ours was to have
    segs = segments.PolicySegments(NS, "default")
    run(segments.append(kube, segs, 0, record(0).to_bytes(), limit))
    assert run(segments.append(kube, segs, 1, record(1).to_bytes(), limit)) == 1
    assert intervals_by_segment(kube) == {"default-dataset-0": [0, 1000], "default-dataset-1": [1]}


def test_endless_conflicts_give_up_for_now_and_the_writer_retries_later():
    rt, kube = setup()
    rt.writers.objects.backoff_s = 0.01
    step(rt, kube, NOW)
    step(rt, kube, NOW + 1200)  # interval 0 closed: segment 0 made
    interloper = Interloper(times=segments.TRIES)
    interloper.objects, interloper._versions = kube.objects, kube._versions
    rt.writers.dataset.api = interloper

    async def close_then_calm():
        from mlsched.controller.scheduling import loop
        body = kube.obj("SchedulingPolicy", NS, "default")
        await loop.run_policy_round(rt, body, kube.indexes(), now=NOW + 2400)
        assert await rt.writers.objects.flush(10)

    failures = rt.process.metrics.api_errors.labels("dataset")
    before = failures._value.get()
    run(close_then_calm())
    assert interloper.conflicts == segments.TRIES  # gave up once, then wrote at the retry
    assert failures._value.get() == before + 1
    assert [r.interval for r in records(kube) if r.interval < 1000] == [0, 1]


# ---- through the operator's rounds ----------------------------------------------------------
def test_many_intervals_take_few_configmaps(monkeypatch):
    monkeypatch.setattr(store, "SEGMENT_BYTES", 4 * 1024)
    rt, kube = setup()
    for i in range(12):
        if i:
            report(rt, kube, "a", 5.0 * i)
        step(rt, kube, NOW + 1200 * i)
    recs = records(kube)
    assert [r.interval for r in recs] == list(range(11))
    names = [c["metadata"]["name"] for c in kube.of_kind("ConfigMap")]
    per_segment = len(store.segment_intervals(kube.obj("ConfigMap", NS, "default-dataset-0")))
    assert per_segment >= 2
    assert len(names) <= -(-11 // per_segment) + 1 < 11, names
    assert all(store.is_segment(c) for c in kube.of_kind("ConfigMap"))


def test_a_learned_policys_open_record_moves_into_the_segment_when_it_closes():
    rt, kube = setup(allocation="dl2")
    for i in range(4):
        report(rt, kube, "a", 1.0 + i)
        step(rt, kube, NOW + 1200 * i)
    names = sorted(c["metadata"]["name"] for c in kube.of_kind("ConfigMap"))
    assert names == ["default-dataset-0", "default-interval-3"]  # 3 is open
    closed = records(kube)
    assert [r.interval for r in closed] == [0, 1, 2] and all(len(r.decisions) == 1 for r in closed)
    assert [r.interval for r in records(kube, include_open=True)] == [0, 1, 2, 3]


def test_a_record_too_large_for_a_segment_keeps_configmaps_of_its_own(monkeypatch):
    rt, kube = setup(allocation="dl2")
    for i in range(2):
        step(rt, kube, NOW + 1200 * i)
    size = len(records(kube)[0].to_bytes())
    monkeypatch.setattr(store, "SEGMENT_BYTES", size - 1)
    step(rt, kube, NOW + 2400)
    assert [r.interval for r in records(kube)] == [0, 1]
    by_name = {c["metadata"]["name"]: c for c in kube.of_kind("ConfigMap")}
    assert sorted(by_name) == ["default-dataset-0", "default-interval-1", "default-interval-2"]
    assert by_name["default-interval-1"]["metadata"]["labels"]["mlsched.io/record-state"] == "closed"


# ---- retention ------------------------------------------------------------------------------
def test_retention_prunes_keys_and_deletes_emptied_segments(monkeypatch):
    rt, kube = setup(retraining={"datasetLimit": 3})
    monkeypatch.setattr(store, "SEGMENT_BYTES", 1)  # measured below, then set
    step(rt, kube, NOW)
    report(rt, kube, "a", 1.0)
    monkeypatch.setattr(store, "SEGMENT_BYTES", 10**6)
    step(rt, kube, NOW + 1200)
    one = store.segment_bytes(kube.obj("ConfigMap", NS, "default-dataset-0"))
    monkeypatch.setattr(store, "SEGMENT_BYTES", 2 * one + one // 2)  # two records a segment
    for i in range(2, 10):
        report(rt, kube, "a", 1.0 + i)
        step(rt, kube, NOW + 1200 * i)
    # Exactly the newest three of intervals 0-8, whatever segments they are in.
    assert [r.interval for r in records(kube)] == [6, 7, 8]
    held = intervals_by_segment(kube)
    assert sorted(sum(held.values(), [])) == [6, 7, 8]
    assert all(held.values()), held  # no empty segment left behind
    assert len(held) <= 2, held
    for cm in kube.of_kind("ConfigMap"):  # the annotations followed the pruning
        assert store.parse_ranges(cm["metadata"]["annotations"][store.INTERVALS]) == \
            store.segment_intervals(cm)


def test_a_new_process_expires_what_an_earlier_one_stored():
    rt, kube = setup(retraining={"datasetLimit": 2})
    for i in range(4):
        step(rt, kube, NOW + 1200 * i)
    assert [r.interval for r in records(kube)] == [1, 2]
    rt2, _ = make_runtime(kube)
    rt2.cluster.indexes = kube.indexes()
    for i in range(4, 7):  # the first carries interval 3 on, the next two close 3 and 4
        step(rt2, kube, NOW + 1200 * i)
    assert [r.interval for r in records(kube)] == [3, 4]
    assert segment_names(kube) == ["default-dataset-0"]


# ---- datasets recorded before segments -------------------------------------------------------
def test_old_records_are_read_numbered_after_and_expired_in_turn():
    rt, kube = setup(retraining={"datasetLimit": 5})
    for n in (0, 1, 2):  # what an operator before segments left: one ConfigMap each
        for body in store.manifests(record(n, note="old"), store.CLOSED):
            kube.put(body)
    for i in range(3):
        step(rt, kube, NOW + 1200 * i)
    recs = records(kube)
    assert [(r.interval, r.policy_uid) for r in recs][:3] == [(0, "puold"), (1, "puold"), (2, "puold")]
    assert [r.interval for r in recs] == [0, 1, 2, 3, 4]  # new ones numbered after the old
    for i in range(3, 6):
        step(rt, kube, NOW + 1200 * i)
    assert [r.interval for r in records(kube)] == [3, 4, 5, 6, 7]
    assert [c["metadata"]["name"] for c in kube.of_kind("ConfigMap")] == ["default-dataset-0"]


def test_an_open_record_left_by_an_operator_before_segments_is_completed_into_a_segment():
    rt, kube = setup(allocation="dl2")
    step(rt, kube, NOW)
    report(rt, kube, "a", 2.0)
    step(rt, kube, NOW + 1200)  # interval 1 open, its record a ConfigMap of its own
    (opened,) = [r for r in records(kube, include_open=True) if r.interval == 1]
    assert "default-interval-1" in [c["metadata"]["name"] for c in kube.of_kind("ConfigMap")]
    rt2, _ = make_runtime(kube)
    rt2.cluster.indexes = kube.indexes()
    step(rt2, kube, NOW + 1300)
    step(rt2, kube, NOW + 2500)
    closed = {r.interval: r for r in records(kube)}
    assert closed[1].decisions[0].time == opened.decisions[0].time and len(closed[1].decisions) == 2
    assert "default-interval-1" not in [c["metadata"]["name"] for c in kube.of_kind("ConfigMap")]


def test_a_leftover_beside_its_segments_copy_is_deleted_at_the_first_listing():
    rt, kube = setup()
    for i in range(3):
        step(rt, kube, NOW + 1200 * i)
    # A crash between the move into the segment and the delete of the open record.
    for body in store.manifests(record(1, note="stale"), store.OPEN):
        kube.put(body)
    assert {r.interval: r.policy_uid for r in records(kube, include_open=True)}[1] != "pustale"
    rt2, _ = make_runtime(kube)
    rt2.cluster.indexes = kube.indexes()
    step(rt2, kube, NOW + 3600)  # carries interval 2 on
    step(rt2, kube, NOW + 4800)  # closes it: the policy's dataset is listed
    assert segment_names(kube) == [c["metadata"]["name"] for c in kube.of_kind("ConfigMap")]


def test_list_records_reads_both_formats():
    from builders import FakeCore

    old = store.manifests(record(0, note="old"), store.CLOSED)
    seg = store.segment_manifest(NS, "default", 0, {n: record(n).to_bytes() for n in (1, 2)})
    other = store.segment_manifest(NS, "other", 0, {3: record(3, policy="other").to_bytes()})
    recs = store.list_records(FakeCore([*old, seg, other]), NS, "default")
    assert [(r.interval, r.policy_uid) for r in recs] == [(0, "puold"), (1, "pu"), (2, "pu")]


# ---- bad input ------------------------------------------------------------------------------
def test_bad_keys_and_bad_records_in_a_segment_are_skipped_and_the_rest_read(caplog):
    good = {n: record(n).to_bytes() for n in (1, 2)}
    cm = store.segment_manifest(NS, "default", 0, good)
    cm["binaryData"].update({
        "interval-3.json.gz": "***not base64***",
        "interval-4.json.gz": base64.b64encode(b"not gzip").decode(),
        "interval-5.json.gz": base64.b64encode(record(6).to_bytes()).decode(),  # another's
        "interval-7.json.gz": base64.b64encode(record(7).to_bytes()[:-9]).decode(),  # cut short
        "notes.txt": base64.b64encode(b"hello").decode(),
    })
    with caplog.at_level(logging.WARNING, "mlsched.formats.dataset_store"):
        assert [r.interval for r in store.read_records([cm])] == [1, 2]
    warned = caplog.text
    for what in ("interval-3.json.gz", "#4", "#5", "#7", "notes.txt"):
        assert what in warned, (what, warned)
    # A segment without the policy annotation is no one's; a malformed annotation counts as
    # no interval held (the next write reads the keys).
    unowned = store.segment_manifest(NS, "default", 1, good)
    del unowned["metadata"]["annotations"][store.POLICY]
    assert store.read_records([unowned]) == []
    odd = store.segment_manifest(NS, "default", 2, good)
    odd["metadata"]["annotations"][store.INTERVALS] = "1-x"
    assert store.stored_segments([odd]) == {2: ("default-dataset-2", set())}


def test_ranges_round_trip():
    for held in ([], [0], [0, 1, 2, 5, 7, 8, 100], list(range(2000))):
        assert store.parse_ranges(store.ranges(held)) == set(held)
    assert store.ranges([3, 1, 2, 9]) == "1-3,9"
    for bad in (None, 5, "a", "1--2", "0-99999999"):
        assert store.parse_ranges(bad) is None, bad


def test_segment_size_is_counted_as_the_api_server_counts_it():
    data = {n: bytes(range(256)) * (n + 1) for n in range(5)}
    cm = store.segment_manifest(NS, "default", 0, data)
    assert store.segment_bytes(cm) == sum(len(store.segment_key(n)) + len(d) for n, d in data.items())
    assert store.fits(cm, 9, b"x" * 10, limit=store.segment_bytes(cm) + len("interval-9.json.gz") + 10)
    assert not store.fits(cm, 9, b"x" * 11, limit=store.segment_bytes(cm) + len("interval-9.json.gz") + 10)


@pytest.mark.parametrize("policy", ["p" * 240])
def test_long_policy_names_give_valid_segment_names(policy):
    name = store.segment_name(policy, 12)
    assert len(name) <= 253 and name.endswith("-dataset-12")
    assert store.segment_name(policy, 12) != store.segment_name(policy[:-1] + "q", 12)
