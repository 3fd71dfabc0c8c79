"""Polling for state the control plane and the operator reach asynchronously.

Every e2e assertion about "eventually" goes through `wait_for`, so a timeout always
says what was awaited and what was last seen instead of a bare `assert False`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_for(check: Callable[[], T], timeout: float, what: str, interval: float = 0.5,
             describe: Callable[[], Any] | None = None) -> T:
    """Polls check() until it returns something truthy, which is returned.

    `describe` (optional) is called on timeout to add the state that was last seen to
    the message: on a slow shared machine, knowing how far things got is what tells a
    bug from a timeout that is too tight.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            seen = ""
            if describe is not None:
                try:
                    seen = f"\nlast seen: {describe()}"
                except Exception as err:  # noqa: BLE001 - the timeout is the real error
                    seen = f"\n(could not describe the state: {err})"
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{seen}")
        time.sleep(interval)
