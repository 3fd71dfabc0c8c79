"""The kopf indexes forget an object that stops qualifying (watched.py, NOT_INDEXED).

kopf keeps an object's earlier index entries when its indexer returns None, and drops those
whose keys the new result lacks: an indexer must answer {} for an object it no longer
indexes. Checked through kopf's own indexers, whose indexes the operator reads."""

from __future__ import annotations

from typing import Any

from kopf._core.actions.execution import Outcome
from kopf._core.engines.indexing import OperatorIndexer, OperatorIndexers

from mlsched.controller.app import watched


def _reindexed(indexer_fn, *bodies: dict[str, Any], **kwargs: Any) -> dict:
    """What kopf's index holds after it indexed each body of one object in turn."""
    indexers = OperatorIndexers()
    indexers["index"] = indexer = OperatorIndexer()
    for body in bodies:
        meta = body["metadata"]
        result = indexer_fn(name=meta["name"], namespace=meta.get("namespace"), body=body,
                            spec=body.get("spec") or {}, labels=meta.get("labels") or {},
                            **kwargs)
        indexers.replace(body, {"index": Outcome(final=True, result=result)})
    return {key: list(store) for key, store in indexer.index.items()}


def _pod(phase: str) -> dict:
    gpus = {"nvidia.com/gpu": "2"}
    return {"metadata": {"name": "batch-0", "namespace": "team", "uid": "u1"},
            "spec": {"nodeName": "n0", "containers": [{"name": "c", "resources": {"requests": gpus}}]},
            "status": {"phase": phase}}


def test_a_pod_that_completes_leaves_the_capacity_index():
    assert list(_reindexed(watched.foreign_pod_index, _pod("Running"))) == ["n0"]
    assert _reindexed(watched.foreign_pod_index, _pod("Running"), _pod("Succeeded")) == {}
    assert _reindexed(watched.foreign_label_index, _pod("Running"), _pod("Failed")) == {}


def test_a_priority_class_no_longer_the_default_leaves_the_index():
    def klass(default: bool) -> dict:
        return {"metadata": {"name": "high", "uid": "u2"}, "value": 1000, "globalDefault": default}
    assert _reindexed(watched.priority_class_index, klass(True)) == {"globalDefault": ["high"]}
    assert _reindexed(watched.priority_class_index, klass(True), klass(False)) == {}


def test_a_quota_that_stops_bounding_anything_leaves_the_index():
    def quota(hard: dict) -> dict:
        return {"metadata": {"name": "q", "namespace": "team", "uid": "u3"},
                "spec": {"hard": hard}, "status": {"hard": hard, "used": {}}}
    assert list(_reindexed(watched.quota_index, quota({"requests.cpu": "4"}))) == ["team"]
    assert _reindexed(watched.quota_index, quota({"requests.cpu": "4"}), quota({})) == {}
