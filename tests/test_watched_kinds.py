"""Adding a watched kind is one table entry (issue 50): app/watched.py's WATCHED, from which the
kopf index registrations, the event handlers that note events and wake admission, INDEXED,
`Indexes` and the in-memory API server's indexes are all derived."""

from __future__ import annotations

import dataclasses
import importlib

import kopf
import pytest

from mlsched.controller.app import watched
from mlsched.controller.scheduling.indexes import Indexes
from memory_kube import MemoryKube

handlers = importlib.import_module("mlsched.controller.app.handlers")  # registers the handlers
# Not indexes: the other namespaces' pods and claims (cluster_pods.py), and the undeclared ones.
NOT_WATCHED = {"other_namespaces", "other_claims", "extra"}


def _for(handler, kind: watched.Watched) -> bool:
    selector = handler.selector
    return ((selector.any_name or selector.plural) == kind.plural
            and (selector.group or "") == kind.group)


def _registered(handlers_, kind: watched.Watched) -> dict[str, list]:
    found: dict[str, list] = {}
    for h in handlers_:
        if _for(h, kind):
            found.setdefault(h.id, []).append(h)
    return found


@pytest.mark.parametrize("kind", watched.WATCHED, ids=lambda k: k.kind)
def test_every_watched_kind_is_registered_with_kopf_and_read_through_indexes(kind):
    registry = kopf.get_default_registry()
    indexing = _registered(registry._indexing.get_all_handlers(), kind)
    watching = _registered(registry._watching.get_all_handlers(), kind)
    for index in kind.indexes:
        assert [h.labels for h in indexing.get(index.id, [])] == [index.labels], index.id
    assert len(watching.get("watch_noted", [])) == 1  # every event noted for the relists
    assert watched.INDEXED[kind.plural] == (kind.group, kind.version,
                                            tuple(i.id for i in kind.indexes))
    if kind.wakes == watched.EVERY_ADMISSION:
        assert len(watching.get("wake_every_admission", [])) == 1
    else:
        for name in kind.wakes:
            assert name in watching and callable(getattr(handlers, name)), name
    given = {i.id: {} for w in watched.WATCHED for i in w.indexes}
    idx = watched.indexes_from(given)
    for index in kind.indexes:  # each read as its attribute (some through a view: `raw`)
        value = getattr(idx, index.field)
        assert getattr(value, "raw", value) is given[index.id], index.field


def test_the_indexes_declared_are_exactly_those_the_table_feeds():
    fields = [i.field for w in watched.WATCHED for i in w.indexes]
    assert len(fields) == len(set(fields))
    declared = {f.name for f in dataclasses.fields(Indexes)} - NOT_WATCHED
    assert declared == set(fields)
    ids = [i.id for w in watched.WATCHED for i in w.indexes]
    assert len(ids) == len(set(ids)) and len({w.kind for w in watched.WATCHED}) == len(watched.WATCHED)


def test_a_new_kind_is_one_entry_kopf_the_fake_and_indexes_all_see(monkeypatch):
    """A kind added to the table only: the in-memory API server indexes its objects and the
    Indexes built from kopf's keywords read it as its attribute, with no field declared."""

    def widget_index(name: str, body, **_):
        return {name: body["spec"]["size"]}

    widgets = watched.Watched("Widget", "example.com", "v1", "widgets",
                              (watched.Index("widgets", widget_index),), wakes=watched.EVERY_ADMISSION)
    monkeypatch.setattr(watched, "WATCHED", (*watched.WATCHED, widgets))
    kube = MemoryKube()
    kube.put({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w1"},
              "spec": {"size": 3}})
    assert kube.indexes().widgets == {"w1": [3]}
    assert watched.indexes_from({i.id: {} for w in watched.WATCHED for i in w.indexes}).widgets == {}
    with pytest.raises(AttributeError):
        kube.indexes().gadgets


def test_label_filters_select_as_kopf_does():
    ours, foreign = (next(i for i in watched.WATCHED[1].indexes if i.id == name)
                     for name in ("pod_index", "foreign_pod_index"))
    job = {watched.JOB_LABEL: "bert"}
    assert ours.selects(job) and not ours.selects({}) and foreign.selects({}) and not foreign.selects(job)
    assert watched.Index("x", len, {"app": "a"}).selects({"app": "a"})
    assert not watched.Index("x", len, {"app": "a"}).selects({"app": "b"})
