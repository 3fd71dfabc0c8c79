"""Active/standby replicas: only the holder of a coordination.k8s.io/v1 Lease writes.

The election is the `kubernetes` client's own (`kubernetes.leaderelection` with its LeaseLock),
not one written here and not kopf peering (which pauses operators; it elects no leader). It runs
in a thread: the client is synchronous.

Every replica runs kopf, so its watches and indexes are warm: a standby that wins the Lease
starts scheduling at once, with no relisting. Until then it writes nothing: no scheduling loop,
no lifecycle sweep, no child creation, no pinning, no status (handlers ask `Leadership.leading`),
its progress endpoint answers 503. Both replicas are Ready; the leader labels its own pod
`mlsched.io/leader=true` (`label_own_pod`, from the downward API's POD_NAME/POD_NAMESPACE) and
the Service selects that label, so reports go to the leader; a replica that starts (a container
restarted in the same pod, say) first removes the label from its pod.

A leader that cannot renew the Lease exits at once (code 3): by then another replica may hold
it, and two writers must never act on the same cluster. Kubernetes restarts the pod, as a
standby. That is what client-go's controllers do.

Timing: a leader renews every RETRY_S; a standby takes the Lease LEASE_S after the last renewal
it saw, so a SIGKILLed leader is replaced within LEASE_S + RETRY_S (9 s).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable

from mlsched.controller.constants import LEADER_LABEL

log = logging.getLogger("mlsched.controller.leadership")

LEASE_S = 8  # how long a Lease stays valid without renewal
RENEW_DEADLINE_S = 6  # a leader that has not renewed for this long gives up (and exits)
RETRY_S = 1  # how often leaders renew and standbys try
EXIT_LOST = 3


async def label_own_pod(api, leading: bool, *, attempts: int = 5, backoff_s: float = 1.0) -> bool:
    """Put LEADER_LABEL on this replica's pod (or take it off). True when done; False when
    not in a pod (no POD_NAME/POD_NAMESPACE: a test, a developer's shell) or after
    `attempts` failures, each logged: the Service then has no endpoint until it succeeds."""
    name, namespace = os.environ.get("POD_NAME"), os.environ.get("POD_NAMESPACE")
    if not name or not namespace:
        return False
    patch = {"metadata": {"labels": {LEADER_LABEL: "true" if leading else None}}}
    for attempt in range(attempts):
        try:
            if await api.patch("Pod", namespace, name, patch):
                log.info("pod %s/%s %s", namespace, name,
                         "labelled the leader" if leading else "not labelled the leader")
                return True
            log.warning("pod %s/%s (POD_NAME/POD_NAMESPACE) does not exist", namespace, name)
            return False
        except Exception as err:  # noqa: BLE001 - retried, then reported
            log.warning("labelling pod %s/%s failed (%s); attempt %d of %d", namespace, name,
                        err, attempt + 1, attempts)
            await asyncio.sleep(backoff_s * 2 ** attempt)
    return False


class Leadership:
    """Whether this process may write. `become_leader` callbacks run on the event loop. A
    process with no election leads from the start."""

    def __init__(self, leading: bool = True) -> None:
        self.leading = leading
        self._callbacks: list[Callable[[], None]] = []

    def on_leading(self, callback: Callable[[], None]) -> None:
        """Run `callback` when this process leads (at once if it already does)."""
        if self.leading:
            callback()
        else:
            self._callbacks.append(callback)

    def become_leader(self) -> None:
        if self.leading:
            return
        self.leading = True
        for callback in self._callbacks:
            callback()
        self._callbacks.clear()


def elect(leadership: Leadership, lease: str, identity: str,
          loop: asyncio.AbstractEventLoop) -> threading.Thread:
    """Start campaigning for `lease` (`namespace/name`); `leadership` becomes the leader on
    `loop` when the Lease is won. Needs the client's default configuration loaded (the
    operator's KubeApi does that)."""
    from kubernetes.leaderelection import electionconfig, leaderelection
    from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

    namespace, name = lease.split("/", 1)

    def won() -> None:
        log.info("leading: %s holds Lease %s", identity, lease)
        loop.call_soon_threadsafe(leadership.become_leader)

    def lost() -> None:
        log.error("lost Lease %s (could not renew it for %d s); exiting so that only one "
                  "replica ever writes", lease, RENEW_DEADLINE_S)
        logging.shutdown()
        os._exit(EXIT_LOST)

    config = electionconfig.Config(LeaseLock(name, namespace, identity), lease_duration=LEASE_S,
                                   renew_deadline=RENEW_DEADLINE_S, retry_period=RETRY_S,
                                   onstarted_leading=won, onstopped_leading=lost)
    log.info("standing by: %s campaigns for Lease %s", identity, lease)
    thread = threading.Thread(target=leaderelection.LeaderElection(config).run,
                              name="mlsched-leader-election", daemon=True)
    thread.start()
    return thread
