"""Fair sharing of GPUs between SchedulingPolicies (controller/scheduling/fair_share.py): the water-filling
itself, and rounds of two policies against the in-memory API."""

from __future__ import annotations

import pytest

from mlsched.controller.scheduling import fair_share, loop
from mlsched.controller.scheduling.fair_share import Claim, water_fill
from builders import NOW, NS, cluster, create_jobs, make_runtime, policy, ps_job, \
    recorded, run


def shares(capacity, **claims):
    return {k: round(v, 3) for k, v in water_fill(capacity, claims).items()}


def test_equal_weights_split_contended_capacity_evenly():
    assert shares(72, a=Claim(1, 80), b=Claim(1, 80)) == {"a": 36, "b": 36}


def test_weights_set_the_proportions():
    assert shares(72, a=Claim(2, 80), b=Claim(1, 80)) == {"a": 48, "b": 24}


def test_what_one_leaves_idle_goes_to_the_others():
    assert shares(72, a=Claim(1, 80), b=Claim(1, 10)) == {"a": 62, "b": 10}
    assert shares(72, a=Claim(1, 80), b=Claim(1, 30), c=Claim(1, 5)) == {"a": 37, "b": 30, "c": 5}


def test_running_minimums_are_never_taken_away():
    # a's running jobs need 50 at their minimum: b gets the rest, not its even half.
    assert shares(72, a=Claim(1, 80, floor=50), b=Claim(1, 80)) == {"a": 50, "b": 22}
    # Floors beyond capacity (a shrunk cluster): each keeps its floor, nobody more.
    assert shares(40, a=Claim(1, 80, floor=30), b=Claim(1, 80, floor=30)) == {"a": 30, "b": 30}


def test_weight_zero_only_borrows():
    assert shares(72, a=Claim(0, 80), b=Claim(1, 30)) == {"a": 42, "b": 30}
    assert shares(72, a=Claim(0, 80, floor=4), b=Claim(1, 80)) == {"a": 4, "b": 68}
    # Every contender of weight 0: shared evenly.
    assert shares(72, a=Claim(0, 80), b=Claim(0, 80)) == {"a": 36, "b": 36}


def test_shares_fill_capacity_exactly_when_contended():
    got = water_fill(100, {"a": Claim(3, 90), "b": Claim(1, 45, floor=40), "c": Claim(0.5, 7)})
    assert sum(got.values()) == pytest.approx(100)
    assert got["b"] >= 40 and got["c"] <= 7


@pytest.mark.parametrize("value, weight", [
    ({"fairSharing": {"weight": 3}}, 3.0), ({"fairSharing": {"weight": 0}}, 0.0),
    ({}, 1.0), (None, 1.0), ({"fairSharing": {"weight": -1}}, 1.0),
    ({"fairSharing": {"weight": "x"}}, 1.0), ({"fairSharing": None}, 1.0),
])
def test_weight_of_a_spec(value, weight):
    assert fair_share.weight_of(value) == weight


# --------------------------------------------------------------- rounds of two policies


def round_(rt, kube, name, now=NOW):
    return recorded(rt, loop.run_policy_round(rt, kube.obj("SchedulingPolicy", NS, name),
                                              kube.indexes(), now=now))


def gpus(report) -> int:
    return sum(t.count("worker") for t in report.targets.values())  # a worker holds 1 GPU


def two_teams(nodes=8, jobs=4, weight_b=None):
    """Policies a and b (DRF) on `nodes` nodes of 2 GPUs, `jobs` jobs each of 1 to 4 workers."""
    rt, kube = make_runtime(cluster(nodes, cpu="32", memory="256Gi"))
    kube.put(policy("a", allocation="drf"))
    kube.put(policy("b", allocation="drf",
                    **({"fairSharing": {"weight": weight_b}} if weight_b is not None else {})))
    return rt, kube, [ps_job(f"{p}{i}", policy=p, max_workers=4) for p in "ab" for i in range(jobs)]


def test_the_first_policy_gives_back_its_borrowed_share_at_its_next_round():
    rt, kube, bodies = two_teams()
    run(create_jobs(rt, kube, *bodies[:4]))  # only a's jobs at first: a borrows everything
    assert gpus(round_(rt, kube, "a")) == 16
    run(create_jobs(rt, kube, *bodies[4:]))
    # b's round sees a's reservations; a gives back at its own next round, through the
    # rescale (no job of a below its minimum of 1).
    assert gpus(round_(rt, kube, "b", NOW + 1)) == 0
    a = round_(rt, kube, "a", NOW + 2)
    assert gpus(a) == 8 and all(t.count("worker") >= 1 for t in a.targets.values())
    assert rt.scheduling.per_policy.fair_shares[(NS, "a")].gpus == pytest.approx(8)
    assert gpus(round_(rt, kube, "b", NOW + 3)) == 8
    # Rounds go on: the split stays.
    assert gpus(round_(rt, kube, "a", NOW + 4)) == 8
    assert gpus(round_(rt, kube, "b", NOW + 5)) == 8


def test_the_idle_share_is_borrowed_once_the_other_has_no_demand():
    rt, kube, bodies = two_teams()
    run(create_jobs(rt, kube, *bodies))
    assert gpus(round_(rt, kube, "a")) == 8
    assert gpus(round_(rt, kube, "b", NOW + 1)) == 8
    for i in range(4):  # b's jobs are gone
        run(kube.delete("MLJob", NS, f"b{i}"))
    rt.scheduling.reservations.drop_policy((NS, "b"))
    assert gpus(round_(rt, kube, "a", NOW + 2)) == 16
    assert (NS, "a") not in rt.scheduling.per_policy.fair_shares  # nothing bounds it now


def test_weights_are_honoured_in_rounds():
    rt, kube, bodies = two_teams(nodes=6, weight_b=2)  # 12 GPUs: a 4, b 8
    run(create_jobs(rt, kube, *bodies))
    assert gpus(round_(rt, kube, "a")) == 4
    assert gpus(round_(rt, kube, "b", NOW + 1)) == 8


def test_a_lone_policy_is_not_bounded():
    rt, kube, bodies = two_teams(nodes=2)
    run(create_jobs(rt, kube, *bodies[:4]))
    assert gpus(round_(rt, kube, "a")) == 4
    assert rt.scheduling.per_policy.fair_shares == {}
