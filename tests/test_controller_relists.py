"""Objects deleted while a watch was down are dropped from kopf's indexes after it lists the
resource again (controller/process/relists.py), through kopf's own indexers."""

from __future__ import annotations

import asyncio

from kopf._core.actions.execution import Outcome
from kopf._core.engines.indexing import OperatorIndexer, OperatorIndexers

from mlsched.controller.app import watched
from mlsched.controller.process.relists import FIRST_LIST_S, Gone, Relists


def _pod(name: str, node: str) -> dict:
    gpus = {"nvidia.com/gpu": "2"}
    return {"metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": gpus}}]},
            "status": {"phase": "Running"}}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _indexed(*pods: dict):
    """kopf's foreign-pod index holding `pods`, as its indexers fill it."""
    indexers = OperatorIndexers()
    indexers["foreign_pod_index"] = OperatorIndexer()
    for body in pods:
        result = watched.foreign_pod_index(spec=body["spec"], body=body)
        indexers.replace(body, {"foreign_pod_index": Outcome(final=True, result=result)})
    return indexers.indices["foreign_pod_index"]


def _relists(present) -> tuple[Relists, Clock, list[list[Gone]]]:
    """Relists that settle at once, on a test clock, and what they report gone."""
    reported: list[list[Gone]] = []

    async def on_gone(gone):
        reported.append(gone)

    clock = Clock()
    return Relists(present, on_gone, settle_s=0.0, clock=clock), clock, reported


async def _settled() -> None:
    for _ in range(3):  # the look it scheduled: its sleep, its listing, its report
        await asyncio.sleep(0)


def test_a_pod_deleted_while_the_watch_was_down_leaves_the_index_after_a_listing_again():
    pods = [_pod("a", "n0"), _pod("b", "n1"), _pod("gone", "n2")]
    asked: list[tuple] = []

    async def present(plural, namespace):
        asked.append((plural, namespace))
        return {"uid-a", "uid-b"}

    async def scenario() -> None:
        index = _indexed(*pods)
        relists, clock, reported = _relists(present)
        for body in pods:  # the first listing
            relists.note("pods", None, body, [index])
        clock.now = 50.0
        relists.note("pods", "MODIFIED", pods[0], [index])  # events go on: nothing to look for
        await asyncio.sleep(0)
        assert asked == [] and sorted(index) == ["n0", "n1", "n2"]
        clock.now = 100.0  # the watch lost its place; kopf lists the pods again: "gone" is not
        for body in pods[:2]:
            relists.note("pods", None, body, [index])
        await _settled()
        # What the new listing did not replay is looked for; only what is gone is dropped.
        assert asked == [("pods", "team")]
        assert reported == [[Gone("pods", "team", "gone", "uid-gone")]]
        assert sorted(index) == ["n0", "n1"]

    asyncio.run(scenario())


def test_a_listing_long_after_the_first_is_a_listing_again_even_of_new_objects():
    """Every pod of the first listing deleted in the gap, a new one created: no object is
    replayed twice, yet the old ones are looked for."""
    old, new = _pod("old", "n0"), _pod("new", "n1")

    async def present(plural, namespace):
        return {"uid-new"}

    async def scenario() -> None:
        index = _indexed(old, new)
        relists, clock, reported = _relists(present)
        relists.note("pods", None, old, [index])
        clock.now = FIRST_LIST_S + 1
        relists.note("pods", None, new, [index])
        await _settled()
        assert reported == [[Gone("pods", "team", "old", "uid-old")]]
        assert sorted(index) == ["n1"]

    asyncio.run(scenario())


def test_an_object_the_api_server_still_has_is_kept():
    """A listing slower than the settling time: the objects it has not replayed yet are looked
    for, found, and kept."""
    a, b = _pod("a", "n0"), _pod("b", "n1")

    async def present(plural, namespace):
        return {"uid-a", "uid-b"}

    async def scenario() -> None:
        index = _indexed(a, b)
        relists, clock, reported = _relists(present)
        relists.note("pods", None, a, [index])
        relists.note("pods", None, b, [index])
        clock.now = 10.0
        relists.note("pods", None, a, [index])  # b not replayed yet
        await _settled()
        assert reported == [] and sorted(index) == ["n0", "n1"]

    asyncio.run(scenario())


def test_every_indexed_resource_is_noted_with_the_indexes_it_feeds():
    """watched.INDEXED names every kopf index the operator reads (indexes_from), each once."""
    fed = [name for _, _, names in watched.INDEXED.values() for name in names]
    read = [i.id for w in watched.WATCHED for i in w.indexes]
    assert sorted(fed) == sorted(read) and len(fed) == len(set(fed))
    watched.indexes_from(dict.fromkeys(fed, {}))  # reads each by that name


def test_a_listing_again_looks_at_every_resource():
    """One outage breaks every watch; a resource whose objects were all deleted lists nothing
    again (no event at all): its objects are looked for when any resource lists again."""
    hog, node = _pod("hog", "n0"), {"metadata": {"name": "n0", "uid": "uid-n0"}}

    async def present(plural, namespace):
        return {"uid-n0"} if plural == "nodes" else set()

    async def scenario() -> None:
        index = _indexed(hog)
        relists, clock, reported = _relists(present)
        relists.note("pods", None, hog, [index])
        relists.note("nodes", None, node, [])
        clock.now = 30.0
        relists.note("nodes", None, node, [])  # nodes listed again; pods list nothing
        await _settled()
        assert reported == [[Gone("pods", "team", "hog", "uid-hog")]]
        assert list(index) == []

    asyncio.run(scenario())


def test_a_resource_that_cannot_be_listed_is_left_as_it_is_and_the_others_are_not():
    hog = _pod("hog", "n0")
    nodes = [{"metadata": {"name": n, "uid": f"uid-{n}"}} for n in ("n0", "n1")]

    async def present(plural, namespace):
        if plural == "nodes":
            raise RuntimeError("403: nodes is forbidden")
        return set()

    async def scenario() -> None:
        index = _indexed(hog)
        relists, clock, reported = _relists(present)
        for node in nodes:
            relists.note("nodes", None, node, [])
        relists.note("pods", None, hog, [index])
        clock.now = 30.0
        relists.note("nodes", None, nodes[0], [])  # n0 listed again, n1 not yet: looked for, in vain
        await _settled()
        assert reported == [[Gone("pods", "team", "hog", "uid-hog")]]
        assert list(index) == []

    asyncio.run(scenario())


def test_each_listing_again_tells_what_is_known_of_resources_it_does_not_index():
    """The operator's record of which Services exist (services.py) is asked again after a
    listing again, whatever the sweep found gone."""
    told: list[float] = []

    async def present(plural, namespace):
        return {"uid-a"}

    async def scenario() -> None:
        index = _indexed(_pod("a", "n0"))
        clock = Clock()

        async def on_gone(gone):
            pass

        relists = Relists(present, on_gone, settle_s=0.0, clock=clock,
                          on_relisted=lambda: told.append(clock.now))
        relists.note("pods", None, _pod("a", "n0"), [index])  # the first listing
        await _settled()
        assert told == []
        clock.now = 100.0
        relists.note("pods", None, _pod("a", "n0"), [index])  # listed again: nothing gone
        await _settled()
        assert told == [100.0]

    asyncio.run(scenario())
