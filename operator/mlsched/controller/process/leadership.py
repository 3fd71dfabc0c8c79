"""Active/standby replicas: only the holder of a coordination.k8s.io/v1 Lease writes.

Every replica runs kopf, so its watches and indexes are warm: a standby that wins the Lease
starts scheduling at once, with no relisting. Until then it writes nothing: no scheduling loop,
no lifecycle sweep, no child creation, no pinning, no status, no Event (handlers ask
`Leadership.leading`), its progress endpoint answers 503. Both replicas are Ready; the leader
labels its own pod `mlsched.io/leader=true` (`label_own_pod`, from the downward API's
POD_NAME/POD_NAMESPACE) and the Service selects that label, so reports go to the leader. A new
leader takes the label off the pod of the Lease's previous holder: a replica that is not the
leader writes nothing at all, not even that.

The election is written here (`Election`), not taken from the `kubernetes` client's
`leaderelection` module: that module lets an error reading the Lease end its thread (an API
server restarted for 4 s did it), after which the leader went on writing with a frozen Lease
and the standby had stopped campaigning (issue 55). Here one loop, in a thread of its own so a
busy event loop cannot starve it, tries every RETRY_S and never ends: every error is logged
and the next try comes.

Fencing, the rule that keeps two replicas from ever writing at once:
- A leader holds the right to write until RENEW_DEADLINE_S after the *start* of its last
  successful renewal (`Leadership.leading` turns False then by itself, whatever the threads
  are doing). Every write the operator sends checks it in the thread that sends it, just
  before sending (kube.ClientKubeApi's fence): a replica that cannot renew stops writing at
  that deadline, though nothing else has noticed yet.
- A standby takes the Lease only after it has seen the same Lease record, unchanged, for the
  Lease's duration (LEASE_S) on its own clock. It saw that record after the renewal that wrote
  it started, so it takes over at least LEASE_S - RENEW_DEADLINE_S (2 s) after the old
  leader's writes stopped: that margin is for a write sent just before the deadline to land.
- Takeovers are updates conditional on the Lease's resourceVersion: of two replicas trying at
  once, one wins and the other gets a conflict.

A leader that misses its deadline (the API server away) is fenced, not finished: it keeps
trying, and when the API server answers and the Lease is still its own (nobody took it
meanwhile, so nobody else wrote), it renews and writes again, as after any outage. When it
finds another replica holds the Lease, what it remembers of its term is stale: it restarts in
place (`restart_in_place`: exec of the same command line), a fresh process that stands by
with nothing from its term and campaigns. No exit, so no CrashLoopBackOff.

Timing: a leader renews every RETRY_S; a standby takes the Lease LEASE_S after the last renewal
it saw, so a SIGKILLed leader is replaced within LEASE_S + RETRY_S (9 s). Lease traffic is
logged at debug level; winning, being fenced, resuming and losing at info and above.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from mlsched.controller.kube.constants import LEADER_LABEL

log = logging.getLogger("mlsched.controller.process.leadership")

LEASE_S = 8  # how long a Lease stays valid without renewal
RENEW_DEADLINE_S = 6  # a leader writes until this long after the start of its last renewal
RETRY_S = 1.0  # how often leaders renew and standbys try
REQUEST_TIMEOUT_S = 2.0  # one Lease request: a hung connection must not outlast a renewal
TROUBLE_LOG_S = 30.0
EXIT_LOST = 3  # the same failure is logged again (at warning) at most this often


async def label_own_pod(api, leading: bool, *, attempts: int = 5, backoff_s: float = 1.0) -> bool:
    """Put LEADER_LABEL on this replica's pod (or take it off). True when done; False when
    not in a pod (no POD_NAME/POD_NAMESPACE: a test, a developer's shell) or after
    `attempts` failures, each logged: the Service then has no endpoint until it succeeds."""
    name, namespace = os.environ.get("POD_NAME"), os.environ.get("POD_NAMESPACE")
    if not name or not namespace:
        return False
    return await _label_pod(api, namespace, name, leading, attempts=attempts, backoff_s=backoff_s)


async def unlabel_previous_leader(api, previous: str | None, *, attempts: int = 5,
                                  backoff_s: float = 1.0) -> bool:
    """Take LEADER_LABEL off the pod of the Lease's previous holder (the Deployment names
    each replica by its pod: --leader-identity=$(POD_NAME)), so the Service stops sending
    reports there. The new leader does it: the old one may be gone, and must not write."""
    namespace, own = os.environ.get("POD_NAMESPACE"), os.environ.get("POD_NAME")
    if not previous or not namespace or previous == own:
        return False
    return await _label_pod(api, namespace, previous, False, attempts=attempts,
                            backoff_s=backoff_s, missing_ok=True)


async def _label_pod(api, namespace: str, name: str, leading: bool, *, attempts: int,
                     backoff_s: float, missing_ok: bool = False) -> bool:
    patch = {"metadata": {"labels": {LEADER_LABEL: "true" if leading else None}}}
    for attempt in range(attempts):
        try:
            if await api.patch("Pod", namespace, name, patch):
                log.info("pod %s/%s %s", namespace, name,
                         "labelled the leader" if leading else "not labelled the leader")
                return True
            if not missing_ok:
                log.warning("pod %s/%s (POD_NAME/POD_NAMESPACE) does not exist", namespace, name)
            return False
        except Exception as err:  # noqa: BLE001 - retried, then reported
            log.warning("labelling pod %s/%s failed (%s); attempt %d of %d", namespace, name,
                        err, attempt + 1, attempts)
            await asyncio.sleep(backoff_s * 2 ** attempt)
    return False


class Leadership:
    """Whether this process may write. A process with no election leads from the start and
    for good; an elected one until RENEW_DEADLINE_S after the start of its last renewal.
    `on_leading` callbacks run on the event loop, once per process (a replica that lost the
    Lease to another restarts, so there is no second term to start in the same process)."""

    def __init__(self, leading: bool = True, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._until = math.inf if leading else -math.inf  # clock seconds; a float: thread-safe
        self._started = leading
        self._callbacks: list[Callable[[], None]] = []
        # Called (from the election's thread) with True when writing is allowed again, False
        # when it stops: kopf's own Events follow it (handlers.py).
        self.watchers: list[Callable[[bool], None]] = []
        # Who held the Lease before this replica won it (its pod loses the leader label).
        self.previous_holder: str | None = None

    @property
    def leading(self) -> bool:
        """May this process write now? Read by the threads that send writes, just before."""
        return self._clock() < self._until

    @property
    def until(self) -> float:
        return self._until

    def hold_until(self, until: float) -> None:
        """The election renewed (or won) the Lease: writes are allowed until `until`."""
        self._until = until

    def fence(self) -> None:
        """Stop writing now (the Lease is another replica's)."""
        self._until = -math.inf
        self.tell(False)

    def tell(self, leading: bool) -> None:
        for watcher in self.watchers:
            watcher(leading)

    def on_leading(self, callback: Callable[[], None]) -> None:
        """Run `callback` when this process starts leading (at once if it already has)."""
        if self._started:
            callback()
        else:
            self._callbacks.append(callback)

    def become_leader(self) -> None:
        """Start what only the leader runs (on the event loop, after the first win)."""
        if self._started:
            return
        self._started = True
        for callback in self._callbacks:
            callback()
        self._callbacks.clear()


# ------------------------------------------------------------------------------- the Lease


@dataclass(frozen=True)
class LeaseRecord:
    holder: str | None
    duration_s: float
    resource_version: str
    acquire_time: str | None
    transitions: int


class Conflict(Exception):
    """Someone else wrote the Lease since it was read (409), or created it first."""


class LeaseStore(Protocol):
    def read(self) -> LeaseRecord | None:
        """The Lease, or None when it does not exist; raises on any other failure."""

    def write(self, holder: str, *, duration_s: float, acquire_time: str, transitions: int,
              resource_version: str | None) -> LeaseRecord:
        """Create the Lease (resource_version None) or replace it if it is still at
        `resource_version`; raises Conflict when it is not."""


def _now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class ClientLeaseStore:
    """The Lease through the `kubernetes` client's ApiClient, as plain JSON with a timeout
    on every request."""

    def __init__(self, api_client, namespace: str, name: str,
                 timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self._client, self._namespace, self._name = api_client, namespace, name
        self._timeout = timeout_s
        self._collection = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"

    def _send(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        params = self._client.param_serialize(
            method=method, resource_path=path, body=body,
            header_params={"Accept": "application/json", "Content-Type": "application/json"},
            auth_settings=["BearerToken"])
        response = self._client.call_api(*params, _request_timeout=self._timeout)
        try:
            data = response.read()
        finally:
            release = getattr(response.response, "release_conn", None)
            if release is not None:
                release()
        try:
            return response.status, json.loads(data or b"{}")
        except ValueError:
            return response.status, {"message": (data or b"").decode(errors="replace")}

    def read(self) -> LeaseRecord | None:
        status, body = self._send("GET", f"{self._collection}/{self._name}")
        if status == 404:
            return None
        if status != 200:
            raise RuntimeError(f"reading Lease {self._namespace}/{self._name}: {status} "
                               f"{body.get('message', '')}")
        return _record(body)

    def write(self, holder: str, *, duration_s: float, acquire_time: str, transitions: int,
              resource_version: str | None) -> LeaseRecord:
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self._name, "namespace": self._namespace},
                "spec": {"holderIdentity": holder, "leaseDurationSeconds": int(duration_s),
                         "acquireTime": acquire_time, "renewTime": _now_micro(),
                         "leaseTransitions": transitions}}
        if resource_version is None:
            status, answer = self._send("POST", self._collection, body)
        else:
            body["metadata"]["resourceVersion"] = resource_version
            status, answer = self._send("PUT", f"{self._collection}/{self._name}", body)
        if status == 409:
            raise Conflict(answer.get("message", "conflict"))
        if status not in (200, 201):
            raise RuntimeError(f"writing Lease {self._namespace}/{self._name}: {status} "
                               f"{answer.get('message', '')}")
        return _record(answer)


def _record(body: dict[str, Any]) -> LeaseRecord:
    spec = body.get("spec") or {}
    return LeaseRecord(holder=spec.get("holderIdentity") or None,
                       duration_s=float(spec.get("leaseDurationSeconds") or LEASE_S),
                       resource_version=str((body.get("metadata") or {}).get("resourceVersion")),
                       acquire_time=spec.get("acquireTime"),
                       transitions=int(spec.get("leaseTransitions") or 0))


# ---------------------------------------------------------------------------- the election


class Election:
    """One replica's campaign. `step()` is one try (read the Lease; renew, take or wait);
    `run()` repeats it every RETRY_S forever, in a thread."""

    def __init__(self, leadership: Leadership, store: LeaseStore, identity: str, *,
                 on_won: Callable[[], None], on_lost: Callable[[], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.leadership, self.store, self.identity = leadership, store, identity
        self.on_won, self.on_lost = on_won, on_lost
        self.clock = clock
        self.won = False  # this process has led (then losing the Lease ends its term)
        self.ended = False  # ... and it has ended
        self._seen: str | None = None  # resourceVersion of the record last seen held by another
        self._seen_at = 0.0  # clock seconds when that record was first seen
        self._trouble: tuple[str, float] | None = None  # (last failure, when logged)
        self._fenced = False  # writing stopped at the deadline, not renewed since

    def step(self) -> None:
        if self.ended:
            return
        started = self.clock()
        record = self.store.read()
        if record is not None and record.holder not in (None, self.identity):
            if self.won:  # another replica took the Lease: this term is over
                log.error("Lease taken by %s: stopped writing; restarting as a standby",
                          record.holder)
                self.leadership.fence()
                self.ended = True  # a term lost is not campaigned for again in this process
                self.on_lost()
                return
            if record.resource_version != self._seen:
                self._seen, self._seen_at = record.resource_version, started
            if started < self._seen_at + record.duration_s:
                log.debug("Lease held by %s; standing by", record.holder)
                return
            log.info("Lease of %s not renewed for %.0f s: taking it", record.holder,
                     started - self._seen_at)
        previous = record.holder if record is not None else None
        taking = previous != self.identity
        renewed = self.store.write(
            self.identity, duration_s=LEASE_S,
            acquire_time=(record.acquire_time if record is not None and not taking else None)
            or _now_micro(),
            transitions=(record.transitions if record is not None else 0)
            + (1 if taking and previous else 0),
            resource_version=record.resource_version if record is not None else None)
        was_leading = self.leadership.leading
        self.leadership.hold_until(started + RENEW_DEADLINE_S)
        self._seen = renewed.resource_version
        if not self.won:
            self.won = True
            self.leadership.previous_holder = previous if taking else None
            log.info("leading: %s holds the Lease", self.identity)
            self.leadership.tell(True)
            self.on_won()
        elif self._fenced or not was_leading:
            self._fenced = False
            log.info("renewed the Lease after an outage: writing again")
            self.leadership.tell(True)
        else:
            log.debug("renewed the Lease")

    def check_deadline(self) -> None:
        """Say so, once, when a leader's deadline passed without a renewal."""
        if self.won and not self._fenced and not self.leadership.leading:
            self._fenced = True
            log.warning("could not renew the Lease for %d s: stopped writing (fenced) until "
                        "it is renewed", RENEW_DEADLINE_S)
            self.leadership.tell(False)

    def run(self) -> None:
        """Campaign and renew until the process ends. Nothing ends this loop."""
        while True:
            started = self.clock()
            try:
                self.step()
                self._trouble = None
            except Conflict as err:
                log.debug("Lease changed while being written (%s); trying again", err)
            except Exception as err:  # noqa: BLE001 - an outage: logged, tried again
                self._report(err)
            self.check_deadline()
            # Wake at the next try, or at the deadline, whichever is first: being fenced is
            # logged when it happens, not a try later.
            wake = started + RETRY_S
            until = self.leadership.until
            if self.leadership.leading and until < wake:
                wake = until
            time.sleep(max(0.0, wake - self.clock()))

    def _report(self, err: Exception) -> None:
        message = f"{type(err).__name__}: {err}"
        now = self.clock()
        if self._trouble is None or self._trouble[0] != message or \
                now - self._trouble[1] >= TROUBLE_LOG_S:
            log.warning("the Lease could not be read or written (%s); trying every %.0f s",
                        message, RETRY_S)
            self._trouble = (message, now)
        else:
            log.debug("the Lease could not be read or written (%s)", message)


def restart_in_place() -> None:
    """Replace this process with a fresh one of the same command line (a standby: it
    remembers nothing of the term it lost). Logs are flushed first; the pid, the container
    and its restart count stay."""
    for handler in logging.getLogger().handlers:
        handler.flush()
    try:
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
    except OSError as err:  # the container then restarts it, as a standby too
        log.error("could not restart in place (%s); exiting with code %d", err, EXIT_LOST)
        logging.shutdown()
        os._exit(EXIT_LOST)


def _own_client(api_client):
    """A client of the election's own, with the same credentials: its connections are not
    queued behind the operator's writes, and urllib3 does not retry for it (three retries a
    try, each logged, during an outage; the election tries again every RETRY_S anyway)."""
    from kubernetes import client

    configuration = copy.copy(api_client.configuration)
    configuration.retries = False
    own = client.ApiClient(configuration)
    own.user_agent = api_client.user_agent
    return own


def elect(leadership: Leadership, lease: str, identity: str, api_client,
          loop: asyncio.AbstractEventLoop, *,
          on_lost: Callable[[], None] = restart_in_place) -> threading.Thread:
    """Campaign for `lease` (`namespace/name`) in a daemon thread; `leadership` becomes the
    leader on `loop` when the Lease is won."""
    namespace, name = lease.split("/", 1)
    election = Election(leadership, ClientLeaseStore(_own_client(api_client), namespace, name),
                        identity,
                        on_won=lambda: loop.call_soon_threadsafe(leadership.become_leader),
                        on_lost=on_lost)
    log.info("standing by: %s campaigns for Lease %s", identity, lease)
    thread = threading.Thread(target=election.run, name="mlsched-leader-election", daemon=True)
    thread.start()
    return thread
