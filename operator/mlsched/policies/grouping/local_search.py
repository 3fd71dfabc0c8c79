"""Local search after the swaps (docs/grouping.md): moves between groups and machines, all
judged by the same predicted score as the rest of the algorithm (algorithm.score with the
'throughput' objective), so it can only raise that score.

The fill and swap steps balance resources at one DoP shared by every group; the score the
policy is judged by lets every group have its own machine count. Against exhaustive search
on small instances that left about 13 % (docs/grouping.md). Here every group has a value
curve V_g(m) = Σ T_itr_j(1) / T_g(m) over its machine count (model.throughput's terms), and
a move between two groups re-splits their machines (plus the unassigned ones) optimally
between them, so a move is judged at the DoPs it would run at:

- move one job to the other group, or out into a new group of its own;
- swap one job of each;
- merge the two groups;
- after each pass, move single machines from the group that loses least to the one that
  gains most while that raises the total (and hand out unassigned machines).

A move is taken only if it raises the score by more than `eps`, so the search ends;
`max_pairs` (group pairs examined in all) bounds its work on big instances, where each group
is paired only with the `window` groups either side in the order of mean iteration time
(similar iteration times are the only ones that share a group well: eq. 1's job-bound term).
"""

from __future__ import annotations

import numpy as np


class Curves:
    """Value of a job set at each machine count 0..L (L = max DoP): Σ T_itr(1) / T_g(m),
    -inf at 0 machines for a non-empty set, 0 for the empty set."""

    def __init__(self, C: np.ndarray, N: np.ndarray, max_dop: int):
        self.L = max_dop
        self.C, self.N = C[:, 1:max_dop + 1], N[:, 1:max_dop + 1]
        self.T = self.C + self.N
        self.t1 = self.T[:, 0]
        zero = np.zeros((1, max_dop))
        self._Cp, self._Np = np.vstack([self.C, zero]), np.vstack([self.N, zero])
        self._Tp, self._t1p = np.vstack([self.T, zero]), np.append(self.t1, 0.0)

    def of_many(self, sets: list[list[int]]) -> np.ndarray:
        """of() for many job sets at once, (len(sets), L + 1): one padded gather."""
        width = max(1, max(len(x) for x in sets))
        pad = len(self.t1)  # an all-zero job
        idx = np.full((len(sets), width), pad)
        for r, x in enumerate(sets):
            idx[r, :len(x)] = x
        c, n, t = self._Cp[idx].sum(1), self._Np[idx].sum(1), self._Tp[idx].max(1)
        g = np.maximum(np.maximum(c, n), t)
        out = np.zeros((len(sets), self.L + 1))
        with np.errstate(divide="ignore", invalid="ignore"):
            out[:, 1:] = np.where(g > 0, self._t1p[idx].sum(1)[:, None] / g, 0.0)
        out[:, 0] = np.where(idx[:, 0] == pad, 0.0, -np.inf)
        return out

    def of(self, members: list[int]) -> np.ndarray:
        return self.of_many([members])[0]


def _smallest(x: np.ndarray, k: int) -> list[int]:
    """Indices of the k smallest entries, smallest first (O(n), not a full sort)."""
    if k <= 0:
        return []
    part = np.argpartition(x, k - 1)[:k] if k < len(x) else np.arange(len(x))
    return part[np.argsort(x[part], kind="stable")].tolist()


class _State:
    """Groups, their curves and machines, the unassigned machines, and each group's
    marginal value of one machine more (up) and one less (down)."""

    def __init__(self, groups, machines, curves: Curves, total: int, job_penalty: float, transfer: int):
        self.groups = [list(g) for g in groups]
        self.m = [int(x) for x in machines]
        self.cv = curves
        self.V = list(curves.of_many(self.groups)) if self.groups else []
        self.free = total - sum(self.m)
        self.J = sum(len(g) for g in self.groups)
        self.pen = job_penalty
        self.X = transfer
        self.n_live = sum(1 for g in self.groups if g)
        self.up = np.array([self._up(g) for g in range(len(self.groups))])
        self.down = np.array([self._down(g) for g in range(len(self.groups))])

    def _up(self, g: int) -> float:  # what one more machine adds
        m, v = self.m[g], self.V[g]
        return float(v[m + 1] - v[m]) if self.groups[g] and m < self.cv.L else -np.inf

    def _down(self, g: int) -> float:  # what one machine less costs
        m, v = self.m[g], self.V[g]
        return float(v[m] - v[m - 1]) if self.groups[g] and m > 1 else np.inf

    def set(self, g: int, members: list[int], v: np.ndarray, m: int) -> None:
        if g == len(self.groups):  # a new group
            self.groups.append([])
            self.V.append(v)
            self.m.append(m)
            self.up, self.down = np.append(self.up, 0.0), np.append(self.down, 0.0)
        self.n_live += bool(members) - bool(self.groups[g])
        self.groups[g], self.V[g], self.m[g] = members, v, m
        self.refresh(g)

    def refresh(self, g: int) -> None:
        self.up[g], self.down[g] = self._up(g), self._down(g)

    def live(self) -> int:
        return self.n_live

    def penalty(self, n_groups: int) -> float:  # algorithm.score's fewer-jobs bias
        return self.pen * (self.J - n_groups) / max(1, n_groups)

    def value_of(self, g: int) -> float:
        return float(self.V[g][self.m[g]]) if self.groups[g] else 0.0

    def value(self) -> float:
        """algorithm.score's value for the 'throughput' objective."""
        return sum(self.value_of(g) for g in range(len(self.groups))) / max(1, self.J) - self.penalty(self.live())

    def market(self, skip: tuple[int, ...]) -> tuple[list[int], list[int], np.ndarray]:
        """The other groups' best X single-machine gains and cheapest X losses, and W[x + X]:
        the value of handing x machines to them (x > 0) or taking -x from them (x < 0).
        Machines nobody gains from stay unassigned (worth 0)."""
        X = self.X
        k = min(X + len(skip), len(self.up))  # the skipped ones may be among the best
        givers = [g for g in _smallest(-self.up, k) if g not in skip][:X]
        takers = [g for g in _smallest(self.down, k) if g not in skip][:X]
        gains = [max(0.0, self.up[g]) for g in givers] + [0.0] * (X - len(givers))
        losses = [self.down[g] for g in takers] + [np.inf] * (X - len(takers))
        W = np.concatenate([(-np.cumsum(losses))[::-1], [0.0], np.cumsum(gains)])
        return givers, takers, W


def improve(groups: list[list[int]], machines, C: np.ndarray, N: np.ndarray, total: int,
            max_dop: int, k_max: int, job_penalty: float = 0.0, window: int = 4,
            max_pairs: int = 4000, transfer: int = 3, eps: float = 1e-9) -> tuple[list[list[int]], np.ndarray]:
    """Local search from (groups, machines); returns the improved groups (none empty) and
    their machine counts. Never returns a lower score than it was given. `transfer`: how
    many machines a move may hand to or take from the other groups."""
    st = _State(groups, machines, Curves(C, N, max_dop), total, job_penalty, transfer)
    pairs = 0
    while pairs < max_pairs:
        changed = False
        alive = [g for g in range(len(st.groups)) if st.groups[g]]
        key = {g: st.cv.t1[st.groups[g]].mean() for g in alive}
        order = sorted(alive, key=lambda g: key[g])
        for pos, g1 in enumerate(order):
            if not st.groups[g1]:
                continue
            changed |= _try(st, g1, None, k_max, eps)
            for g2 in order[max(0, pos - window):pos + window + 1]:
                if g2 == g1 or not st.groups[g1] or not st.groups[g2]:
                    continue
                pairs += 1
                changed |= _try(st, g1, g2, k_max, eps)
                if pairs >= max_pairs:
                    break
            if pairs >= max_pairs:
                break
        changed |= _rebalance(st, eps)
        if not changed:
            break
    keep = [g for g in range(len(st.groups)) if st.groups[g]]
    return [st.groups[g] for g in keep], np.array([st.m[g] for g in keep], dtype=int)


def _candidates(A: list[int], B: list[int] | None, k_max: int):
    """New member lists (A', B') for the moves between A and B; B None: splits of A."""
    if B is None:
        if len(A) > 1:
            for i, a in enumerate(A):
                yield A[:i] + A[i + 1:], [a]
        return
    if len(A) + len(B) <= k_max:
        yield A + B, []
    for i, a in enumerate(A):
        if len(B) < k_max:
            yield A[:i] + A[i + 1:], B + [a]
        for k, b in enumerate(B):
            yield A[:i] + [b] + A[i + 1:], B[:k] + [a] + B[k + 1:]
    for k, b in enumerate(B):
        if len(A) < k_max:
            yield A + [b], B[:k] + B[k + 1:]


def _try(st: _State, g1: int, g2: int | None, k_max: int, eps: float) -> bool:
    """The best move between g1 and g2 (or a split of g1 when g2 is None), its machines
    re-split between the two, the unassigned ones and up to X of the other groups'; applied
    if the exact score rises."""
    new_g = g2 is None
    g2 = len(st.groups) if new_g else g2
    A, B = st.groups[g1], ([] if new_g else st.groups[g2])
    m2 = 0 if new_g else st.m[g2]
    pool = st.m[g1] + m2 + st.free
    G = st.live()
    X, L = st.X, st.cv.L
    givers, takers, W = st.market((g1,) if new_g else (g1, g2))
    lo = max(0, pool - X)
    b = np.arange(lo, pool + X + 1)
    old = st.value_of(g1) + (0.0 if new_g else st.value_of(g2))
    cands = list(_candidates(A, None if new_g else B, k_max))
    if not cands:
        return False
    curves = st.cv.of_many([x for pair in cands for x in pair])
    vA, vB = curves[0::2], curves[1::2]
    envA, envB = np.maximum.accumulate(vA, axis=1), np.maximum.accumulate(vB, axis=1)
    split = np.arange(L + 1)
    rest = np.minimum(b, 2 * L)[:, None] - split[None, :]  # machines left for B, (budgets, splits)
    pair = envA[:, None, :] + np.where(rest >= 0, envB[:, np.clip(rest, 0, L)], -np.inf)
    pair = pair.max(axis=2)  # (candidates, budgets); B beyond L machines gains nothing more
    total = pair + W[np.clip(pool - b, -X, X) + X][None, :]
    kb = total.argmax(axis=1)
    best_val = total[np.arange(len(cands)), kb]
    live = G - (not A) - (not B) + np.array([bool(x) + bool(y) for x, y in cands])
    pens = np.array([st.penalty(int(x)) for x in live])
    gains = (best_val - old) / st.J - (pens - st.penalty(G))
    k = int(np.argmax(gains))
    if not gains[k] > eps:
        return False
    newA, newB = cands[k]
    vA, vB, budget = vA[k], vB[k], int(b[kb[k]])
    # apply: the pair's machines, then the transfers; then check the exact score
    pair = (g1,) if new_g else (g1, g2)
    saved = [(g, st.groups[g], st.V[g], st.m[g]) for g in pair]
    saved_free, old_pen = st.free, st.penalty(G)
    env1, env2 = np.maximum.accumulate(vA), np.maximum.accumulate(vB)
    a = np.arange(min(budget, L) + 1)
    split = int(a[np.argmax(env1[a] + env2[np.minimum(budget - a, L)])])
    ma = int(np.argmax(vA[:split + 1]))
    mb = int(np.argmax(vB[:min(budget - split, L) + 1]))
    st.free = pool - ma - mb
    st.set(g1, newA, vA, ma)
    st.set(g2, newB, vB, mb)  # appends when g2 is new
    delta = st.value_of(g1) + st.value_of(g2) - old
    moved = []
    r = pool - budget
    for g in (givers if r > 0 else takers)[:abs(r)]:
        if (r > 0 and st.up[g] <= 0) or (r < 0 and st.m[g] <= 1):
            continue
        d = 1 if r > 0 else -1
        delta -= st.value_of(g)
        st.m[g] += d
        st.free -= d
        st.refresh(g)
        delta += st.value_of(g)
        moved.append((g, d))
    if st.free >= 0 and delta / st.J - (st.penalty(st.live()) - old_pen) > eps:
        return True
    for g, d in moved:  # the market's estimate was off: undo
        st.m[g] -= d
        st.refresh(g)
    if new_g:
        st.set(g2, [], st.V[g2], 0)  # keeps n_live right, then drop the row
        st.groups.pop(), st.V.pop(), st.m.pop()
        st.up, st.down = st.up[:-1], st.down[:-1]
    for g, members, v, m in saved:
        st.set(g, members, v, m)
    st.free = saved_free
    return False


def _rebalance(st: _State, eps: float) -> bool:
    """Single machines from the group losing least (or the unassigned) to the one gaining
    most, and back to the unassigned from a group past its best DoP."""
    changed = False
    for _ in range(sum(st.m) + st.free + 1):
        to = int(np.argmax(st.up))
        if st.free > 0 and st.up[to] > eps:
            st.m[to] += 1
            st.free -= 1
            st.refresh(to)
        else:
            down = st.down.copy()
            down[to] = np.inf
            frm = int(np.argmin(down))
            if np.isfinite(st.up[to]) and st.up[to] - down[frm] > eps:
                st.m[to] += 1
                st.m[frm] -= 1
            else:
                frm = int(np.argmin(st.down))
                if not st.down[frm] < -eps:
                    break
                st.m[frm] -= 1
                st.free += 1
            st.refresh(to)
            st.refresh(frm)
        changed = True
    return changed
