"""Harmony's grouping and machine allocation (Lee et al., §IV-B3), on profile arrays.

The paper gives the steps, not Algorithm 1's code; each open choice is a parameter of
HarmonyConfig (harmony.py) and is listed in docs/grouping.md:

1. `choose_group_count`: for candidate group counts n (all from ⌈J/k_max⌉ to min(J, M), or
   `max_candidates` of them spaced geometrically), every group gets M/n machines, jobs are
   grouped by step 2 at that DoP, and the n with the best predicted cluster score wins, a
   fewer-jobs-per-group bias (`job_penalty` per extra member) breaking near-ties.
2. `fill`: sort by iteration time (similar sizes share a group, so no group is job-bound),
   then fill a band of groups at a time from the next jobs of the sorted list, dealing them
   by compute/communication lean so that opposite leans share a group.
3. `swap`: take the most imbalanced group (model.imbalance), look at the `partners` groups
   whose lean (Σ compute − Σ comm) is most the other way, and apply the job swap that lowers the two groups' summed
   imbalance most; repeat until no group finds one (a strict decrease each time, so it ends;
   `max_swaps` bounds it anyway). Heaps with stale-entry skipping keep each step O(log n).
4. `allocate_machines`: every group starts with one machine; each further machine goes to
   the group whose jobs it speeds up most (Σ members × relative drop of T_g), the paper's
   "needs it most" (a CPU-bound group's T_g falls with machines, a network-bound one's not).
5. local_search.py (not the paper's) then moves jobs and machines between groups by the same
   predicted score; harmony.py runs it after step 4.
"""

from __future__ import annotations

import heapq
import itertools
import math

import numpy as np

from mlsched.policies.grouping.model import cluster_score, group_time, imbalance, throughput


def dop_of(machines: np.ndarray, max_dop: int) -> np.ndarray:
    return np.clip(machines, 1, max_dop).astype(int)


def flat(groups: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(job index, group index) of every member, as arrays: what the vectorised sums need."""
    sizes = np.fromiter((len(g) for g in groups), dtype=int, count=len(groups))
    idx = np.fromiter(itertools.chain.from_iterable(groups), dtype=int, count=int(sizes.sum()))
    return idx, np.repeat(np.arange(len(groups)), sizes)


def group_sums(groups: list[list[int]], C: np.ndarray, N: np.ndarray, dop,
               members: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, ...]:
    """Σ compute, Σ comm and the slowest member's iteration per group, at each group's DoP."""
    idx, g_of = members if members is not None else flat(groups)
    d = np.asarray(dop)[g_of] if np.ndim(dop) else np.full(len(idx), dop)
    c, n = C[idx, d], N[idx, d]
    k = len(groups)
    cs = np.bincount(g_of, weights=c, minlength=k)
    ns = np.bincount(g_of, weights=n, minlength=k)
    tm = np.zeros(k)
    np.maximum.at(tm, g_of, c + n)
    return cs, ns, tm


def alone_sums(groups: list[list[int]], C: np.ndarray, N: np.ndarray,
               members: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Σ of the members' iteration time alone at DoP 1, per group (the throughput unit)."""
    idx, g_of = members if members is not None else flat(groups)
    return np.bincount(g_of, weights=C[idx, 1] + N[idx, 1], minlength=len(groups))


def fill(order: np.ndarray, n_groups: int, c: np.ndarray, n: np.ndarray, band: int = 8) -> list[list[int]]:
    """Step 2: `order` is the job indices sorted by iteration time, longest first; c and n
    are their compute and comm (by job index) at the DoP considered. Groups are filled
    `band` at a time from consecutive jobs of the sorted list (similar iteration times), and
    inside a band the jobs are dealt by lean (compute − comm share) in a snake order, so the
    most compute-heavy and the most communication-heavy land together."""
    J = len(order)
    sizes = [J // n_groups + (1 if g < J % n_groups else 0) for g in range(n_groups)]
    groups: list[list[int]] = [[] for _ in range(n_groups)]
    t = c + n
    lean = np.where(t > 0, (c - n) / np.where(t > 0, t, 1.0), 0.0)
    pos = 0
    for first in range(0, n_groups, band):
        gids = list(range(first, min(first + band, n_groups)))
        take = sum(sizes[first:first + band])
        chunk = order[pos:pos + take]
        pos += take
        chunk = chunk[np.argsort(-lean[chunk], kind="stable")]
        room = {g: sizes[g] for g in gids}
        forward, k = True, 0
        for j in chunk.tolist():
            while True:  # next group in snake order that still has room
                seq = gids if forward else gids[::-1]
                g = seq[k]
                k += 1
                if k == len(seq):
                    k, forward = 0, not forward
                if room[g] > 0:
                    break
            groups[g].append(j)
            room[g] -= 1
    return groups


def swap(groups: list[list[int]], c: np.ndarray, n: np.ndarray, partners: int = 4,
         max_swaps: int | None = None) -> int:
    """Step 3, in place; c and n are per job at the DoP the groups run at. Returns the count
    of swaps made. Every swap strictly lowers the sum of group imbalances."""
    k = len(groups)
    if k < 2 or max(len(g) for g in groups) < 2:
        return 0  # singletons only: a swap changes nothing
    cl = c.tolist()
    nl = n.tolist()
    cs = [sum(cl[j] for j in g) for g in groups]
    ns = [sum(nl[j] for j in g) for g in groups]
    version = [0] * k

    def imb(ci: float, ni: float, tmax: float) -> float:  # model.imbalance, inlined
        t = max(ci, ni, tmax)
        return 2.0 - (ci + ni) / t if t > 0 else 0.0

    def tmax_of(g: list[int]) -> float:
        return max((cl[j] + nl[j] for j in g), default=0.0)

    def state(i: int) -> tuple[float, float]:
        t = max(cs[i], ns[i], tmax_of(groups[i]))
        return imb(cs[i], ns[i], t), ((cs[i] - ns[i]) / t if t > 0 else 0.0)

    worst: list[tuple[float, int, int]] = []  # (-imbalance, group, version)
    low: list[tuple[float, int, int]] = []  # (lean, group, version): most comm-heavy first
    high: list[tuple[float, int, int]] = []  # (-lean, group, version): most compute-heavy first

    def push(i: int) -> None:
        im, le = state(i)
        heapq.heappush(worst, (-im, i, version[i]))
        heapq.heappush(low, (le, i, version[i]))
        heapq.heappush(high, (-le, i, version[i]))

    for i in range(k):
        push(i)
    budget = max_swaps if max_swaps is not None else 20 * k
    made = 0
    while worst and made < budget:
        neg, g1, v = heapq.heappop(worst)
        if v != version[g1] or -neg <= 1e-9 or len(groups[g1]) < 1:
            continue
        lean1 = cs[g1] - ns[g1]
        heap = low if lean1 > 0 else high
        cands, popped = [], []
        while heap and len(cands) < partners:
            entry = heapq.heappop(heap)
            popped.append(entry)
            _, g2, v2 = entry
            if v2 == version[g2] and g2 != g1 and g2 not in cands:
                cands.append(g2)
        for entry in popped:
            if entry[2] == version[entry[1]]:
                heapq.heappush(heap, entry)
        best = None
        t1 = tmax_of(groups[g1])
        before1 = imb(cs[g1], ns[g1], t1)
        top1 = _top_two(groups[g1], cl, nl)
        for g2 in cands:
            t2 = tmax_of(groups[g2])
            before = before1 + imb(cs[g2], ns[g2], t2)
            top2 = _top_two(groups[g2], cl, nl)
            for a_pos, a in enumerate(groups[g1]):
                for b_pos, b in enumerate(groups[g2]):
                    dc, dn = cl[b] - cl[a], nl[b] - nl[a]
                    # the slowest member after the swap: the largest of those staying and
                    # the one arriving (exact, from each group's two largest)
                    n1 = imb(cs[g1] + dc, ns[g1] + dn, max(_without(top1, a_pos), cl[b] + nl[b]))
                    n2 = imb(cs[g2] - dc, ns[g2] - dn, max(_without(top2, b_pos), cl[a] + nl[a]))
                    gain = before - (n1 + n2)
                    if gain > 1e-12 and (best is None or gain > best[0]):
                        best = (gain, g2, a_pos, b_pos)
        if best is None:
            continue  # stuck; it is pushed again if a partner's swap changes it
        _, g2, a_pos, b_pos = best
        a, b = groups[g1][a_pos], groups[g2][b_pos]
        groups[g1][a_pos], groups[g2][b_pos] = b, a
        cs[g1] += cl[b] - cl[a]
        ns[g1] += nl[b] - nl[a]
        cs[g2] += cl[a] - cl[b]
        ns[g2] += nl[a] - nl[b]
        for g in (g1, g2):
            version[g] += 1
            push(g)
        made += 1
    return made


def _top_two(group: list[int], cl: list[float], nl: list[float]) -> tuple[float, int, float]:
    """(largest iteration, its position, second largest) among a group's members."""
    first, pos, second = 0.0, -1, 0.0
    for i, j in enumerate(group):
        t = cl[j] + nl[j]
        if t > first:
            first, pos, second = t, i, first
        elif t > second:
            second = t
    return first, pos, second


def _without(top: tuple[float, int, float], skip: int) -> float:
    return top[2] if skip == top[1] else top[0]


def allocate_machines(groups: list[list[int]], C: np.ndarray, N: np.ndarray, total: int,
                      max_dop: int, start: np.ndarray | None = None) -> np.ndarray:
    """Step 4: machines per group, `total` in all (a group beyond max_dop gains nothing, so
    machines no group can use stay unassigned). `start`: machines the groups already have
    (regrouping hands out only the freed ones)."""
    k = len(groups)
    machines = np.ones(k, dtype=int) if start is None else np.asarray(start, dtype=int).copy()
    if k == 0 or total <= machines.sum():
        return machines
    dops = np.arange(1, max_dop + 1)
    members = flat(groups)
    # T_g at every DoP per group, (k, max_dop)
    T = np.stack([group_time(*group_sums(groups, C, N, d, members)) for d in dops], axis=1)
    t1 = alone_sums(groups, C, N, members)

    def gain(g: int, m: int) -> float:  # the throughput one more machine adds
        if m >= max_dop:
            return 0.0
        return t1[g] * (1.0 / T[g, m] - 1.0 / T[g, m - 1])

    heap = [(-gain(g, int(machines[g])), g) for g in range(k)]
    heapq.heapify(heap)
    left = total - int(machines.sum())
    while left > 0 and heap:
        neg, g = heapq.heappop(heap)
        if neg >= 0:
            break  # nobody gains: keep the rest unassigned
        machines[g] += 1
        left -= 1
        heapq.heappush(heap, (-gain(g, int(machines[g])), g))
    return machines


def score(groups: list[list[int]], C: np.ndarray, N: np.ndarray, dop, machines, objective: str,
          cpu_weight: float, job_penalty: float) -> float:
    """A grouping's predicted worth: 'throughput' (model.throughput) or the paper's
    'utilisation' (eq. 4); minus the fewer-jobs bias, `job_penalty` per extra member."""
    members = flat(groups)
    cs, ns, tm = group_sums(groups, C, N, dop, members)
    if objective == "throughput":
        value = throughput(cs, ns, tm, alone_sums(groups, C, N, members)) / max(1, len(members[0]))
    else:
        value = cluster_score(cs, ns, tm, machines, cpu_weight)
    extra = sum(len(g) - 1 for g in groups) / max(1, len(groups))
    return value - job_penalty * extra


def choose_group_count(order: np.ndarray, C: np.ndarray, N: np.ndarray, total: int, k_max: int,
                       max_dop: int, cpu_weight: float, job_penalty: float,
                       max_candidates: int, objective: str = "throughput") -> tuple[int, list[list[int]]]:
    """Step 1 (with step 2 for each candidate): the best group count and its filled groups."""
    J = len(order)
    lo, hi = max(1, math.ceil(J / k_max)), max(1, min(J, total))
    lo = min(lo, hi)
    if hi - lo + 1 <= max_candidates:
        cands = list(range(lo, hi + 1))
    else:
        cands = sorted(set(np.unique(np.geomspace(lo, hi, max_candidates).round().astype(int)).tolist()))
    best: tuple[float, int, list[list[int]]] | None = None
    for n_groups in cands:
        d = int(min(max(total // n_groups, 1), max_dop))
        c, n = C[:, d], N[:, d]
        by_time = order[np.argsort(-(c[order] + n[order]), kind="stable")]
        groups = fill(by_time, n_groups, c, n)
        value = score(groups, C, N, d, np.full(n_groups, total / n_groups), objective, cpu_weight, job_penalty)
        if best is None or value > best[0] + 1e-12:
            best = (value, n_groups, groups)
    assert best is not None
    return best[1], best[2]


def total_imbalance(groups: list[list[int]], c: np.ndarray, n: np.ndarray) -> float:
    cs = np.array([c[g].sum() for g in groups])
    ns = np.array([n[g].sum() for g in groups])
    tm = np.array([(c[g] + n[g]).max() if g else 0.0 for g in groups])
    return float(imbalance(cs, ns, tm).sum())
