"""A control plane for a pytest fixture: started with its nodes, or the test fails with the
plane's own message (which names the logs it kept) and the plane stopped."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest

from controlplane import ControlPlane, ControlPlaneError
from mlsched_objects import install_crds


def install_crds_first(plane: ControlPlane) -> None:
    """For ControlPlane(before_controllers=...): the CRDs installed (and Established) before
    kube-controller-manager starts, so that its garbage collector watches MLJobs from its first
    sync. Installed after KCM, the kind is picked up only at the collector's next discovery
    (every 30 s, hard-wired in KCM), and the first MLJob deleted kept its children until then:
    the session's first operator test spent 35-40 s in teardown waiting for its pods to be
    garbage-collected (an MLJob owning a ConfigMap: its child gone 41 s after the owner's
    deletion, 0.2 s with the CRDs installed first). The `crds` fixtures install them again,
    finding them there."""
    api = plane.api_client()
    try:
        install_crds(api)
    finally:
        api.close()


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
