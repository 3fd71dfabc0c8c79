"""ModelInDomain: is the round inside the setting the served learned models were trained in
(their cards' domain, policies/model_domain.py)? The condition, and the Events.       pure

Checked every round, for every phase a learned model serves (a heuristic, the fallback
included, has no card and adds nothing). Outside is reported at once, not after a few rounds
as work conservation is: the cluster's shape does not flicker from round to round, and a
user should know before the model has done harm. One Event per change: a Warning when the
condition turns False, a Normal one when it is True again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from mlsched.features.card import ModelCard
from mlsched.policies.model_domain import Domain, RoundShape, check, describe, served_cards

__all__ = ["DomainVerdict", "event", "served_cards", "verdict"]

OUTSIDE, INSIDE, NO_DOMAIN = "OutsideTrainedDomain", "InsideTrainedDomain", "NoDomainInCard"


@dataclass(frozen=True)
class DomainVerdict:
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str

    @property
    def gauge(self) -> float | None:
        """The metric's value: 1 inside, 0 outside, None (no series) when unknown."""
        return {"True": 1.0, "False": 0.0}.get(self.status)


def verdict(cards: Iterable[tuple[str, ModelCard]], shape: RoundShape) -> DomainVerdict | None:
    """The condition for a round of this shape; None when no learned model serves.
    Outside wins over unknown: a card that says enough to tell is reported even when
    another card of the policy says nothing."""
    cards = list(cards)
    if not cards:
        return None
    outside, unknown = [], []
    for label, card in cards:
        domain = Domain.from_json(card.domain)
        if domain is None:
            unknown.append(label)
        elif found := check(domain, shape):
            outside.append(f"{label}: {describe(found)}")
    if outside:
        return DomainVerdict("False", OUTSIDE, "; ".join(outside))
    if unknown:
        return DomainVerdict("Unknown", NO_DOMAIN, f"the model card of {', '.join(unknown)} "
                                                   "records no training domain")
    return DomainVerdict("True", INSIDE, f"{', '.join(label for label, _ in cards)}: "
                                         f"{_count(shape.nodes, 'node')} and "
                                         f"{_count(shape.jobs, 'job')} inside the trained domain")


def event(before: str | None, now: DomainVerdict | None) -> tuple[str, str, str] | None:
    """(type, reason, message) of the Event to post when the condition goes from status
    `before` (None: absent) to `now`; None when nothing changed that a user must hear."""
    if now is None or now.status == before:
        return None
    if now.status == "False":
        return "Warning", "ModelOutsideDomain", now.message
    if now.status == "True" and before == "False":
        return "Normal", "ModelInDomain", now.message
    return None


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")
