"""A learned model's domain: the setting it was trained in, as its card records it, and the
check of one round against it.                                                       pure

A learned policy is only as good as the clusters and workloads it saw in training (issue 51:
the shipped `chic`, trained on one 10-GPU pool, gives 2.76 x Optimus's average JCT on 30
nodes). So every exporter writes the card's `domain` (policy_models/domain.py) and the
operator and `mlsched simulate` check each round against it. The card's format:

    "domain": {
      "nodes": {"min": 1, "max": 1},            cluster sizes trained on
      "node_gpus": {"min": 10, "max": 10},      per-node shape
      "node_cpus": {"min": 120, "max": 120},
      "jobs_present": {"min": 0, "max": 30},    jobs waiting or running at once
      "models": [...], "architectures": ["ps"], the job mix
      "gpu_types": ["v100", "p100", "k80"],     GPU types trained on (absent: untyped only)
      "window": 3,                              jobs the model sees (record only)
      "pools": 1, "jobs_per_trace": {...}, "arrivals_per_hour": {...},
      "simulator_version": "sim-2",             (record only)
      "sources": {"nodes": "where the figure came from", ...}
    }

Every field is optional; a card with no `domain` (a user's model) has no domain, which the
callers report as unknown rather than as inside.

Tolerance: a number is inside when it lies within [LOW x the smallest trained value, HIGH x
the largest], i.e. half to twice what training saw. A learned policy reads sizes through
normalised features, so a cluster somewhat smaller or larger than any it saw still looks like
training to it; one an order of magnitude away does not, and issue 51's failure (30 nodes
against one pool) is well outside. Models and architectures are names: inside only when
training saw them. GPU types too, and a domain without `gpu_types` (every model trained before
the simulator had types) saw only untyped clusters: a typed one is outside it. Arrival rate,
pools, window and simulator version are recorded for people and not checked: a round does not
show a rate, and the others are not properties of a round.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mlsched.cluster.types import Snapshot
from mlsched.features.card import ModelCard

LOW, HIGH = 0.5, 2.0


@dataclass(frozen=True)
class Range:
    lo: float
    hi: float

    @classmethod
    def from_json(cls, raw: Any) -> "Range | None":
        if not isinstance(raw, Mapping) or "min" not in raw or "max" not in raw:
            return None
        return cls(float(raw["min"]), float(raw["max"]))

    def admits(self, value: float) -> bool:
        return LOW * self.lo - 1e-9 <= value <= HIGH * self.hi + 1e-9

    def __str__(self) -> str:
        return f"{self.lo:g}–{self.hi:g}"


@dataclass(frozen=True)
class Domain:
    """What a round is checked against; None: the card does not say (not checked)."""

    nodes: Range | None = None
    node_gpus: Range | None = None
    node_cpus: Range | None = None
    jobs_present: Range | None = None
    models: frozenset[str] | None = None
    architectures: frozenset[str] | None = None
    gpu_types: frozenset[str] = frozenset()  # trained on; empty: untyped clusters only

    @classmethod
    def from_json(cls, raw: Any) -> "Domain | None":
        """The domain of a card's `domain` object; None when the card has none."""
        if not isinstance(raw, Mapping) or not raw:
            return None

        def names(key: str) -> frozenset[str] | None:
            value = raw.get(key)
            return frozenset(str(v) for v in value) if isinstance(value, list) and value else None

        return cls(nodes=Range.from_json(raw.get("nodes")),
                   node_gpus=Range.from_json(raw.get("node_gpus")),
                   node_cpus=Range.from_json(raw.get("node_cpus")),
                   jobs_present=Range.from_json(raw.get("jobs_present")),
                   models=names("models"), architectures=names("architectures"),
                   gpu_types=names("gpu_types") or frozenset())


@dataclass(frozen=True)
class RoundShape:
    """What of one round a domain is checked against: the cluster the policy schedules on
    and the jobs it decides for (waiting and running)."""

    nodes: int
    node_gpus: tuple[float, ...]
    node_cpus: tuple[float, ...]
    jobs: int
    models: frozenset[str]
    architectures: frozenset[str]
    gpu_types: frozenset[str] = frozenset()  # the nodes' GPU types (empty: untyped)


def shape_of(snapshot: Snapshot) -> RoundShape:
    """The round's shape as the policy sees it (a snapshot, in the operator or simulator)."""
    cap = snapshot.capacity
    return RoundShape(nodes=len(snapshot.node_names),
                      node_gpus=tuple(float(g) for g in cap[:, 1]) if len(cap) else (),
                      node_cpus=tuple(float(c) for c in cap[:, 0]) if len(cap) else (),
                      jobs=len(snapshot.jobs),
                      models=frozenset(j.model for j in snapshot.jobs),
                      architectures=frozenset(str(j.arch) for j in snapshot.jobs),
                      gpu_types=frozenset(t for t in snapshot.gpu_types or () if t is not None))


@dataclass(frozen=True)
class Outside:
    """One way a round is outside a domain: `what` is `value`, training saw `trained`."""

    what: str
    value: str
    trained: str

    def describe(self) -> str:
        return f"{self.what} {self.value} outside trained {self.trained}"


def check(domain: Domain, shape: RoundShape) -> list[Outside]:
    """Everything about `shape` outside `domain` (tolerance in the module doc); [] inside."""
    out: list[Outside] = []
    if domain.nodes and not domain.nodes.admits(shape.nodes):
        out.append(Outside("nodes", f"{shape.nodes}", str(domain.nodes)))
    for what, trained, values in (("node GPUs", domain.node_gpus, shape.node_gpus),
                                  ("node CPUs", domain.node_cpus, shape.node_cpus)):
        bad = sorted({v for v in values if trained and not trained.admits(v)})
        if bad:
            out.append(Outside(what, _numbers(bad), str(trained)))
    if domain.jobs_present and not domain.jobs_present.admits(shape.jobs):
        out.append(Outside("jobs", f"{shape.jobs}", str(domain.jobs_present)))
    for what, trained, seen in (("models", domain.models, shape.models),
                                ("architectures", domain.architectures, shape.architectures)):
        unseen = sorted(seen - trained) if trained else []
        if unseen:
            out.append(Outside(what, ", ".join(unseen), ", ".join(sorted(trained))))
    unseen = sorted(shape.gpu_types - domain.gpu_types)
    if unseen:
        out.append(Outside("GPU types", ", ".join(unseen),
                           ", ".join(sorted(domain.gpu_types)) or "none (untyped clusters)"))
    return out


def describe(outside: Iterable[Outside]) -> str:
    """One line for a condition message, an Event or the simulator's warning."""
    return "; ".join(o.describe() for o in outside)


def _numbers(values: list[float], shown: int = 4) -> str:
    text = ", ".join(f"{v:g}" for v in values[:shown])
    return text + (f" and {len(values) - shown} more" if len(values) > shown else "")


def served_cards(*policies) -> list[tuple[str, ModelCard]]:
    """(label, card) of each learned policy among `policies` (the round's grouping,
    allocation and placement; a heuristic has no card): e.g. ("allocation chic", card)."""
    out = []
    for policy in policies:
        card = getattr(policy, "card", None)
        if card is not None:
            out.append((f"{card.phase} {getattr(policy, 'name', card.algorithm)}", card))
    return out


@dataclass
class DomainTally:
    """A run's rounds checked against the served models' domains (the simulator's summary):
    how many were outside, and the first value found outside for each model and figure."""

    domains: list[tuple[str, Domain | None]]
    rounds: int = 0
    outside_rounds: int = 0
    first: dict[tuple[str, str], Outside] = field(default_factory=dict)

    @classmethod
    def of(cls, cards: Iterable[tuple[str, ModelCard]]) -> "DomainTally":
        return cls([(label, Domain.from_json(card.domain)) for label, card in cards])

    def add(self, shape: RoundShape) -> None:
        if not self.domains:
            return
        self.rounds += 1
        found = [(label, o) for label, d in self.domains if d for o in check(d, shape)]
        self.outside_rounds += bool(found)
        for label, o in found:
            self.first.setdefault((label, o.what), o)

    @property
    def unknown(self) -> tuple[str, ...]:
        """Labels of the served models whose cards record no domain."""
        return tuple(label for label, d in self.domains if d is None)

    def outside(self) -> str:
        """What was outside, per model ("" when nothing was)."""
        labels = dict.fromkeys(label for label, _ in self.first)
        return "; ".join(f"{label}: " + describe(o for (l, _), o in self.first.items() if l == label)
                         for label in labels)
