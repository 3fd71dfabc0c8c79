"""The interference model reproduces published measurements of co-located training jobs
(docs/simulator.md has the table) and saturates the way contention does."""

import numpy as np
import pytest

from mlsched.workloads import catalog
from mlsched.workloads.interference import (DEMAND, DIMENSIONS, SENSITIVITY, PressureTracker, job_pressures,
                                            job_speed_factors, max_slowdown, node_capacity, pair_slowdown)

CTC = "cnn-text-classification"


# ---- Harmony placement (Bao et al., ToN 2022, §III-A, 1 PS + 1 worker per job) ------------
def test_six_jobs_bin_packed_two_per_server_slow_down_about_a_third():
    pairs = [("resnet-50", "vgg-16"), ("resnext-110", CTC), ("seq2seq", "wlm")]
    slowdowns = [pair_slowdown(a, b) for a, b in pairs] + [pair_slowdown(b, a) for a, b in pairs]
    assert np.mean(slowdowns) == pytest.approx(0.33, abs=0.05)  # paper: 33 %


def test_resnext_is_nearly_two_times_slower_next_to_ctc():
    assert pair_slowdown("resnext-110", CTC) == pytest.approx(0.5, abs=0.05)  # speed roughly halves


def test_resnext_with_wlm_or_seq2seq_interferes_little():
    assert pair_slowdown("resnext-110", "wlm") < 0.15
    assert pair_slowdown("resnext-110", "seq2seq") < 0.15


@pytest.mark.parametrize("victim", catalog.MODEL_NAMES)
def test_ctc_hurts_every_neighbour(victim):
    with_ctc = pair_slowdown(victim, CTC)
    others = [pair_slowdown(victim, n) for n in catalog.MODEL_NAMES if n != CTC]
    assert with_ctc >= 0.2
    assert with_ctc > np.mean(others)


def test_resnext_suffers_more_from_ctc_than_vgg_does():
    assert pair_slowdown("resnext-110", CTC) > pair_slowdown("vgg-16", CTC)


def test_more_ctc_neighbours_hurt_more():
    one = job_speed_factors({"a": ("resnext-110", [0]), "c1": (CTC, [0])})["a"]
    two = job_speed_factors({"a": ("resnext-110", [0]), "c1": (CTC, [0]), "c2": (CTC, [0])})["a"]
    assert two < one < 1


# ---- Gandiva (Xiao et al., OSDI 2018: DLT job characteristics, sensitivity to interference)
def test_two_language_model_jobs_slow_each_other_by_about_a_fifth():
    assert pair_slowdown("wlm", "wlm") == pytest.approx(0.19, abs=0.05)


def test_resnet_is_barely_slowed_by_a_language_model():
    assert pair_slowdown("resnet-50", "wlm") <= 0.06


# ---- network contention (MLTCP, CASSINI): at most about 2x ---------------------------------
def test_network_heavy_jobs_sharing_a_nic_lose_at_most_half_their_speed():
    assert 0.2 < pair_slowdown("vgg-16", "vgg-16") <= 0.5
    # however many neighbours, contention for the NIC alone at most doubles a step
    assert all(SENSITIVITY[m][DIMENSIONS.index("network")] <= 1.0 for m in catalog.MODEL_NAMES)


# ---- saturation -------------------------------------------------------------------------
@pytest.mark.parametrize("victim", catalog.MODEL_NAMES)
def test_many_small_tasks_of_one_noisy_job_slow_a_neighbour_only_so_far(victim):
    slow = [1 - job_speed_factors({"a": (victim, [0, 0]), "c": (CTC, [0] * k)})["a"]
            for k in (1, 2, 4, 8, 16, 64, 1000)]
    assert all(x <= y + 1e-12 for x, y in zip(slow, slow[1:]))  # more pressure, never faster
    assert slow[-1] < max_slowdown(victim) <= 0.65  # bounded, whatever the task count
    assert slow[-1] - slow[3] < 0.1  # past oversubscription, more tasks add little


def test_pressure_is_relative_to_what_the_node_has():
    # one task each: the reference node's CPU has room, a 4-core node's is oversubscribed
    placements = {"a": ("resnext-110", [0]), "c": (CTC, [0])}
    small = job_speed_factors(placements, capacity=node_capacity(4))["a"]
    ref = job_speed_factors(placements)["a"]
    big = job_speed_factors(placements, capacity=node_capacity(32))["a"]
    assert small < ref < big < 1
    assert job_speed_factors(placements, capacity=node_capacity(8)) == job_speed_factors(placements)
    per_node = job_speed_factors(placements, capacity={0: node_capacity(32)})
    assert per_node["a"] == pytest.approx(big)
    # oversubscribed, the others hold their proportional share, whatever the capacity
    two = {"a": ("resnext-110", [0, 0]), "c": (CTC, [0, 0])}
    four, six = (job_speed_factors(two, capacity=node_capacity(c)) for c in (4, 6))
    assert four == pytest.approx(six)


def test_alone_or_apart_there_is_no_interference():
    f = job_speed_factors({"a": ("resnet-50", [0, 0, 1]), "b": (CTC, [2, 3])})
    assert f == {"a": 1.0, "b": 1.0}


# ---- the simulator's incremental pressures ------------------------------------------------
@pytest.mark.parametrize("capacity", [None, node_capacity(6), {n: node_capacity(4 + n) for n in range(12)}])
@pytest.mark.parametrize("seed", range(4))
def test_pressures_kept_between_changes_are_exactly_those_computed_afresh(capacity, seed):
    # jobs start, finish, gain, lose and move tasks, change group and (now and then) come in
    # another order: after each change the tracker answers job_pressures' floats, bit for bit
    rng = np.random.default_rng(seed)
    models = sorted(SENSITIVITY)
    tracker = PressureTracker(capacity)
    placements: dict[str, tuple[str, list[int]]] = {}
    groups: dict[str, str] = {}
    fresh_names = (f"j{k}" for k in range(10_000))
    for step in range(150):
        kind = rng.integers(6)
        if kind <= 1 or len(placements) < 3:
            name = next(fresh_names)
            placements[name] = (models[rng.integers(len(models))], rng.integers(12, size=rng.integers(1, 7)).tolist())
        elif kind == 2:
            del placements[list(placements)[rng.integers(len(placements))]]
        elif kind == 3:  # a task moves, one more starts, or one stops
            name = list(placements)[rng.integers(len(placements))]
            nodes = list(placements[name][1])
            change = rng.integers(3)
            if change == 0:
                nodes[rng.integers(len(nodes))] = int(rng.integers(12))
            elif change == 1 or len(nodes) == 1:
                nodes.insert(int(rng.integers(len(nodes) + 1)), int(rng.integers(12)))
            else:
                del nodes[rng.integers(len(nodes))]
            placements[name] = (placements[name][0], nodes)
        elif kind == 4:
            name = list(placements)[rng.integers(len(placements))]
            if rng.random() < 0.7:
                groups[name] = f"g{rng.integers(2)}"
            else:
                groups.pop(name, None)
        elif rng.random() < 0.3:
            items = list(placements.items())
            rng.shuffle(items)
            placements = dict(items)
        current = {n: g for n, g in groups.items() if n in placements} if step % 3 else None
        expected = job_pressures(placements, current, capacity)
        got = tracker.pressures({n: (m, list(nodes)) for n, (m, nodes) in placements.items()}, current)
        assert list(got) == list(expected)
        assert got == expected  # exact floats, not approx
    assert any(p > 0 for p in expected.values())


def _pressures_on_arrays(placements, groups, capacity) -> dict[str, float]:
    """job_pressures as it was computed before its terms were taken in plain floats (issue 52):
    each node's demands summed per job, and each term in array arithmetic."""
    per_node: dict[int, dict[str, np.ndarray]] = {}
    for job, (model, nodes) in placements.items():
        for n in nodes:
            here = per_node.setdefault(n, {})
            here[job] = here.get(job, 0.0) + DEMAND[model]
    out = {}
    for job, (model, nodes) in placements.items():
        terms = [0.0]
        for n in set(nodes):
            here, mine = per_node[n], groups.get(job) if groups else None
            others = [d for other, d in here.items()
                      if other != job and (mine is None or groups.get(other) != mine)]
            if others:
                cap = 1.0 if capacity is None else capacity[n] if isinstance(capacity, dict) else capacity
                o = sum(others) / cap
                terms.append(float(SENSITIVITY[model] @ (o / np.maximum(1.0, o + here[job] / cap))))
        out[job] = max(terms)
    return out


@pytest.mark.parametrize("capacity", [None, node_capacity(6), {n: node_capacity(4 + n) for n in range(8)}])
@pytest.mark.parametrize("seed", range(4))
def test_pressures_in_floats_are_the_array_arithmetics_to_the_bit(capacity, seed):
    rng = np.random.default_rng(seed)
    models = sorted(SENSITIVITY)
    interfering = 0
    for _ in range(40):  # crowded nodes: many jobs, several tasks each, some grouped
        placements = {f"j{k}": (models[rng.integers(len(models))],
                                rng.integers(8, size=rng.integers(1, 6)).tolist())
                      for k in range(int(rng.integers(2, 14)))}
        groups = {name: f"g{rng.integers(2)}" for name in placements if rng.random() < 0.4}
        for current in (None, groups):
            expected = _pressures_on_arrays(placements, current, capacity)
            assert job_pressures(placements, current, capacity) == expected  # exact floats
            interfering += sum(p > 0 for p in expected.values())
    assert interfering > 200  # terms were computed, not only jobs alone on their nodes
