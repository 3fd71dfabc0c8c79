"""A control plane for a pytest fixture: started with its nodes, or the test fails with the
plane's own message (which names the logs it kept) and the plane stopped."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest

from controlplane import ControlPlane, ControlPlaneError


def running_plane(plane: ControlPlane, add_nodes: Callable[[ControlPlane], None],
                  live_output: contextlib.AbstractContextManager | None = None
                  ) -> Iterator[ControlPlane]:
    """Yields the started plane and stops it afterwards. `live_output` is held around the
    start (a cold build's progress shown instead of captured)."""
    failure = None
    try:
        with live_output or contextlib.nullcontext():
            plane.start()
        add_nodes(plane)
    except ControlPlaneError as err:
        plane.stop()
        failure = str(err)
    if failure:
        # Outside the except block, so pytest shows the message without a chain.
        pytest.fail(f"the control plane did not come up:\n{failure}", pytrace=False)
    yield plane
    plane.stop()
