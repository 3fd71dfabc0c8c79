"""A token bucket: `rate` tokens a second, at most `burst` saved. The background writers
(write_queue.py) queue behind it; the progress endpoint's token reviews (token_reviews.py)
refuse past it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class TokenBucket:
    """A rate <= 0 is no limit."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic):
        self.rate, self.burst, self.clock = rate, max(1.0, burst), clock
        self.tokens, self.stamp = self.burst, clock()

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now

    def reserve(self) -> float:
        """Take a token; the seconds to wait before using it (the balance may go negative:
        each caller waits its turn, in order)."""
        if self.rate <= 0:
            return 0.0
        self._refill()
        self.tokens -= 1.0
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate

    def try_take(self) -> float:
        """0 if a token is there (and takes it), else the seconds until one is (taking none)."""
        if self.rate <= 0:
            return 0.0
        self._refill()
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate

    async def take(self) -> None:
        wait = self.reserve()
        if wait > 0:
            await asyncio.sleep(wait)
