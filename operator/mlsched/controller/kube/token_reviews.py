"""TokenReviews for the progress endpoint: cached per token and limited in rate.

Without this, every report costs one TokenReview, so anyone who can reach the endpoint makes
the API server do one review per request it sends: 1,000 junk tokens, 1,000 reviews. Now:

- Answers are cached by the token's SHA-256 (the raw token is never kept): a valid token for
  `ok_ttl` seconds, a refused one for `refused_ttl` (shorter, so a token that was not valid
  yet, e.g. from a pod that had just been created, is not refused for long). A bounded LRU,
  so a flood of distinct tokens cannot grow memory. Concurrent requests with one token share
  one review.
- Reviews not served from the cache draw from a token bucket (`rate` per second, `burst` at
  once). An empty bucket raises Throttled: the endpoint answers 429 with Retry-After and the
  API server sees nothing.

A cached valid answer only says who the token belongs to; the endpoint still checks on every
report that the pod exists with the same uid and belongs to the job, so a token of a pod
deleted within `ok_ttl` is still refused.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from mlsched.controller.kube.token_bucket import TokenBucket

Review = Callable[[str, list[str]], Awaitable[dict[str, Any]]]


class Throttled(Exception):
    def __init__(self, retry_after: float):
        super().__init__(f"too many unknown tokens: retry in {retry_after:.1f}s")
        self.retry_after = retry_after


class TokenReviews:
    def __init__(self, review: Review, *, rate: float, burst: int, ok_ttl: float = 60.0,
                 refused_ttl: float = 10.0, max_entries: int = 10_000,
                 on_review: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.review = review
        if rate <= 0 or burst < 1:
            raise ValueError(f"token review rate must be > 0 and burst >= 1 (got {rate}, {burst})")
        self.bucket = TokenBucket(rate, burst, clock)
        self.ok_ttl, self.refused_ttl, self.max_entries = ok_ttl, refused_ttl, max_entries
        self.on_review = on_review or (lambda result: None)  # metrics: one call per review sent
        self.clock = clock
        self._cache: OrderedDict[str, tuple[float, dict[str, Any]]] = OrderedDict()
        self._in_flight: dict[str, asyncio.Future] = {}

    @staticmethod
    def key(token: str, audiences: list[str]) -> str:
        return hashlib.sha256("\n".join([token, *audiences]).encode()).hexdigest()

    async def __call__(self, token: str, audiences: list[str]) -> dict[str, Any]:
        """The TokenReview status for this token, from the cache or the API server. Raises
        Throttled instead of reviewing beyond the rate; API errors propagate (not cached)."""
        key = self.key(token, audiences)
        cached = self._cache.get(key)
        if cached is not None:
            expires, status = cached
            if expires > self.clock():
                self._cache.move_to_end(key)
                return status
            del self._cache[key]
        pending = self._in_flight.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        wait = self.bucket.try_take()
        if wait:
            raise Throttled(wait)
        future = asyncio.get_running_loop().create_future()
        self._in_flight[key] = future
        try:
            status = await self.review(token, audiences)
        except BaseException as err:
            self.on_review("error")
            future.set_exception(err)
            future.exception()  # retrieved: no "never retrieved" warning when nobody waited
            raise
        finally:
            del self._in_flight[key]
        ok = bool(status.get("authenticated"))
        self.on_review("authenticated" if ok else "unauthenticated")
        self._remember(key, status, self.ok_ttl if ok else self.refused_ttl)
        future.set_result(status)
        return status

    def _remember(self, key: str, status: dict[str, Any], ttl: float) -> None:
        self._cache[key] = (self.clock() + ttl, status)
        self._cache.move_to_end(key)
        while len(self._cache) > self.max_entries:
            self._cache.popitem(last=False)

    def __len__(self) -> int:
        return len(self._cache)


def retry_after_header(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))
