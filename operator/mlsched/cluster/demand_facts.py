"""What a round's ledger derives from each distinct task demand, made once per demand: a round
places hundreds of tasks of a handful of demands, and checks where they fit tens of thousands
of times.
"""

from __future__ import annotations

import numpy as np

EPS = 1e-9  # the rounding tolerance of every capacity comparison the ledger makes
LOAD_VECTORS = 256  # distinct demands per round whose load steps are computed for all nodes


class DemandFacts:
    """What a round's ledger derives from one distinct task demand, once: the free capacity a
    node needs for it (the demand less a rounding tolerance, -inf for a resource the task does
    not use, which never blocks it), as a (3, 1) column to compare all nodes at once and as
    plain floats to check one node; the demand as plain floats; and, once a task is placed,
    the load one such task adds on each node (RoundDemands.load_step)."""

    __slots__ = ("column", "need", "amounts", "load_steps")

    def __init__(self, demand: np.ndarray):
        self.column = np.where(demand > 0, demand - EPS, -np.inf)[:, None]
        self.need = tuple(self.column[:, 0].tolist())
        # The demand itself as plain floats: booking one task subtracts them from one node's
        # free capacity float by float (the same IEEE doubles as the array arithmetic gives, at
        # a fraction of the cost of a numpy column update).
        self.amounts = tuple(demand.tolist())
        self.load_steps: np.ndarray | dict[int, float] | None = None


class RoundDemands:
    """The DemandFacts of one round's demands, on nodes of `capacity` ((N, 3))."""

    def __init__(self, capacity: np.ndarray):
        # Normalised load per node is the sum over resources of used/capacity.
        self._inv_cap = np.where(capacity > 0, 1.0 / np.maximum(capacity, EPS), 0.0)
        self._facts: dict[tuple[str, bytes], DemandFacts] = {}  # by the demand's values
        # ... and by the demand array's identity (a round passes the same few arrays, the
        # JobViews', tens of thousands of times: their bytes need not be read each time).
        self._facts_of_array: dict[int, tuple[np.ndarray, DemandFacts]] = {}
        self._load_vectors = 0  # DemandFacts.load_steps made for every node (see load_step)

    def facts(self, demand: np.ndarray) -> DemandFacts:
        """What the round derives from `demand`, made once per distinct one."""
        found = self._facts_of_array.get(id(demand))
        if found is not None and found[0] is demand:  # (an id is only unique while it lives)
            return found[1]
        key = demand.dtype.str, demand.tobytes()
        facts = self._facts.get(key)
        if facts is None:
            facts = self._facts[key] = DemandFacts(demand)
        self._facts_of_array[id(demand)] = (demand, facts)
        return facts

    def load_step(self, demand: np.ndarray, node: int, facts: DemandFacts | None = None) -> float:
        """The normalised load one task of `demand` adds on `node`: the dot product, computed
        once per demand and node (placing and undoing a task add and subtract the same float):
        for every node at once for the first LOAD_VECTORS distinct demands (a round places
        thousands of tasks of a handful of demands), node by node for any beyond (a vector per
        distinct demand would take 40 KB at 5,000 nodes). `facts`: the demand's, when the
        caller has them already."""
        if facts is None:
            facts = self.facts(demand)
        steps = facts.load_steps
        if steps is None:
            if self._load_vectors < LOAD_VECTORS:
                self._load_vectors += 1
                steps = facts.load_steps = self._inv_cap @ demand
            else:
                steps = facts.load_steps = {}
        if isinstance(steps, dict):
            step = steps.get(node)
            if step is None:
                step = steps[node] = float(demand @ self._inv_cap[node])
            return step
        return steps[node]

    def load_steps(self, demand: np.ndarray, nodes: list[int]) -> np.ndarray:
        """load_step(demand, n) for each of `nodes`, as an array."""
        facts = self.facts(demand)
        if facts.load_steps is None:
            self.load_step(demand, nodes[0])  # makes the demand's steps, a vector or a dict
        if isinstance(facts.load_steps, np.ndarray):
            return facts.load_steps[nodes]
        return np.array([self.load_step(demand, n) for n in nodes], dtype=float)
