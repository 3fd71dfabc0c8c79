"""written_status.py: the operator's status patches laid over MLJob bodies its watch
delivers before they show them, until the watch shows them."""

from __future__ import annotations

import random

from mlsched.controller.kube.written_status import WrittenStatus, merged, shows

KEY = ("ns", "bert")


def body(status):
    return {"metadata": {"namespace": "ns", "name": "bert"}, "status": status}


def test_merge_patch_semantics():
    base = {"phase": "New", "replicaStatuses": {"worker": {"ready": 0, "desired": 2}}, "x": 1}
    patch = {"phase": "Running", "replicaStatuses": {"worker": {"ready": 2}}, "x": None,
             "conditions": [{"type": "Running"}]}
    out = merged(base, patch)
    assert out == {"phase": "Running", "replicaStatuses": {"worker": {"ready": 2, "desired": 2}},
                   "conditions": [{"type": "Running"}]}
    assert base["replicaStatuses"]["worker"]["ready"] == 0  # not changed in place
    assert shows(out, patch) and not shows(base, patch)


def test_an_older_body_shows_the_written_status_until_the_echo_arrives():
    clock = [0.0]
    written = WrittenStatus(clock=lambda: clock[0])
    written.wrote(KEY, {"phase": "Running", "replicaStatuses": {"worker": {"ready": 1}}})
    written.wrote(KEY, {"replicaStatuses": {"worker": {"ready": 2}}})
    old = body({"phase": "New", "replicaStatuses": {"worker": {"ready": 0, "desired": 2}}})
    seen = written.over(KEY, old)
    assert seen["status"] == {"phase": "Running",
                              "replicaStatuses": {"worker": {"ready": 2, "desired": 2}}}
    assert old["status"]["phase"] == "New"  # the watch's body is not changed
    # The first patch's echo alone is older than the second patch: still laid over.
    first_echo = body({"phase": "Running", "replicaStatuses": {"worker": {"ready": 1, "desired": 2}}})
    assert written.over(KEY, first_echo)["status"]["replicaStatuses"]["worker"]["ready"] == 2
    echo = body({"phase": "Running", "replicaStatuses": {"worker": {"ready": 2, "desired": 2}}})
    assert written.over(KEY, echo) is echo and not written
    # From then on bodies are taken as they are, even one that changed it since.
    later = body({"phase": "Failed"})
    assert written.over(KEY, later) is later


def test_what_is_never_echoed_is_dropped_after_the_ttl():
    clock = [0.0]
    written = WrittenStatus(clock=lambda: clock[0])
    written.wrote(KEY, {"phase": "Running"})
    clock[0] = WrittenStatus.TTL_S + 1
    old = body({"phase": "New"})
    assert written.over(KEY, old) is old and not written
    written.wrote(KEY, {"phase": "Running"})
    written.forget(KEY)
    assert written.over(KEY, old) is old


def test_random_patch_sequences_lay_over_any_older_body_what_the_server_holds():
    rng = random.Random(7)
    fields = ["phase", "reason", "a", "b"]

    def value():
        return rng.choice([None, 1, "x", {"k": rng.randint(0, 2), "j": rng.choice([None, 3])}])

    for _ in range(500):
        written = WrittenStatus(clock=lambda: 0.0)
        base = merged({}, {name: value() for name in rng.sample(fields, 2)})
        server = base
        for _ in range(rng.randint(1, 5)):
            patch = {name: value() for name in rng.sample(fields, rng.randint(1, 3))}
            server = merged(server, patch)
            written.wrote(KEY, patch)
        seen = written.over(KEY, body(base))["status"]
        assert seen == server, (base, server, seen)
        assert written.over(KEY, body(server))["status"] == server and not written
