"""A real Kubernetes control plane on 127.0.0.1 for end-to-end tests.

etcd, kube-apiserver, kube-controller-manager (KCM), kube-scheduler and kwok run
as child processes, built by build_control_plane.sh, with every controller
running, so that workloads behave as in a cluster: KCM turns StatefulSets into
pods and issues ServiceAccount tokens, the scheduler binds pods, and kwok plays
the kubelet of fake GPU nodes. This module starts, restarts and stops them; the
flags are in flags.py, keys in pki.py, tokens and kubeconfigs in credentials.py,
fake nodes in fake_nodes.py and kwok_stages.yaml.

    plane = ControlPlane()
    plane.start()
    plane.create_nodes(3)
    api = plane.api_client()
    ...
    plane.stop()

Logs, certificates, kubeconfigs and etcd's data live in one temp dir
(`plane.workdir`, removed by stop() unless MLSCHED_E2E_KEEP=1).
"""

from __future__ import annotations

import atexit
import base64
import datetime
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from kubernetes import client, config

import credentials
import fake_nodes
import flags
from build_scripts import BuildScriptError, run_build_script
from credentials import Credentials
from pki import make_pki
from processes import Component, ComponentError

BUILD_SCRIPT = Path(__file__).resolve().parent / "build_control_plane.sh"


class ControlPlaneError(RuntimeError):
    pass


def build_binaries() -> Path:
    """Runs the build script (instant when cached) and returns its bin dir."""
    try:
        return run_build_script(BUILD_SCRIPT, "the control plane")
    except BuildScriptError as err:
        raise ControlPlaneError(str(err)) from None


def read_versions(bin_dir: Path) -> dict[str, str]:
    """The versions the build script recorded: K8S_VERSION, ETCD_VERSION, KWOK_VERSION,
    COREDNS_VERSION."""
    text = (bin_dir.parent / "versions.env").read_text()
    return dict(line.split("=", 1) for line in text.split() if "=" in line)


def _free_ports(count: int) -> list[int]:
    # Hold every socket until all ports are picked, so none is picked twice.
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class ControlPlane:
    def __init__(self, *, startup_timeout: float = 120.0, audit_policy: dict | None = None,
                 extra_flags: dict[str, list[str]] | None = None, address: str = "127.0.0.1",
                 before_controllers: Callable[[ControlPlane], None] | None = None):
        self.startup_timeout = startup_timeout
        # Run once the API server answers and before KCM starts: plane_fixture.install_crds_first
        # installs the CRDs there, so that KCM's garbage collector watches MLJobs from its first
        # sync rather than from its next discovery, every 30 s.
        self.before_controllers = before_controllers
        # The apiserver's address: loopback, or the real node's bridge (e2e/real_node.py), which
        # must exist before start().
        self.address = address
        # An audit policy (audit.k8s.io/v1 Policy) makes the apiserver log the requests it
        # selects, as JSON lines, to audit_log_path: who asked for what, and the answer.
        self.audit_policy = audit_policy
        # Per component, flags added to its defaults (flags.py): the benchmark raises KCM's and
        # the scheduler's client rates as a cluster sized for thousands of pods would.
        self.extra_flags = extra_flags or {}
        self.workdir: Path | None = None
        self.kubeconfig_path: Path | None = None
        self.bin_dir: Path | None = None
        self.versions: dict[str, str] = {}
        self.apiserver_url = ""
        self.etcd_url = ""
        self._keep_workdir = os.environ.get("MLSCHED_E2E_KEEP") == "1"
        self._components: dict[str, Component] = {}
        self._node_serial = 0
        self._layout: flags.Layout | None = None
        self._admin: client.ApiClient | None = None  # for the harness's own calls
        self.startup_s: float | None = None  # set by start()

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self.bin_dir = build_binaries()
        self.versions = read_versions(self.bin_dir)
        self.workdir = Path(tempfile.mkdtemp(prefix="mlsched-e2e-"))
        atexit.register(self.stop)
        started = time.monotonic()
        try:
            self._start_all()
        except BaseException as err:
            # Keep the dir: the logs named in the error must still be there.
            self._keep_workdir = True
            self._stop_components()
            if isinstance(err, (ComponentError, RuntimeError)):
                raise ControlPlaneError(f"{err}\n(all logs kept in {self.workdir})") from err
            raise
        # From the processes' launch to a plane that answers (the binaries already built).
        self.startup_s = time.monotonic() - started

    def _start_all(self) -> None:
        self._start_apiserver()
        if self.before_controllers is not None:
            self.before_controllers(self)
        self._start_controllers()

    def _start_apiserver(self) -> None:
        """etcd, then kube-apiserver, ready: all an ApiServerPlane runs."""
        assert self.workdir is not None
        (self.workdir / "logs").mkdir()
        pki = make_pki(self.workdir / "pki", self.address)
        ports = flags.Ports(*_free_ports(6))
        self.apiserver_url = f"https://{self.address}:{ports.apiserver}"
        self.etcd_url = f"http://127.0.0.1:{ports.etcd}"
        creds = Credentials(self.workdir, self.apiserver_url, pki.ca_cert)
        self.kubeconfig_path = creds.kubeconfig(credentials.ADMIN)
        layout = self._layout = flags.Layout(self.workdir, ports, pki, creds, self.address)

        # Each waits for what it needs: etcd before the apiserver, the apiserver
        # before its clients.
        self._add("etcd", flags.etcd(layout))
        self._components["etcd"].wait_healthy(
            f"{self.etcd_url}/health", timeout=self.startup_timeout,
            expect='"health":"true"')

        apiserver_flags = flags.apiserver(layout)
        if self.audit_policy is not None:
            apiserver_flags += flags.audit(layout, self.audit_policy)
        self._add("kube-apiserver", apiserver_flags)
        self._wait_apiserver()

    def _start_controllers(self) -> None:
        """KCM, the scheduler and kwok, healthy, and the default ServiceAccount KCM makes."""
        layout = self._layout
        self._add("kube-controller-manager", flags.controller_manager(layout)
                  + self.extra_flags.get("kube-controller-manager", []))
        self._add("kube-scheduler", flags.scheduler(layout) + self.extra_flags.get("kube-scheduler", []))
        self._add("kwok", flags.kwok(layout))
        for name in ("kube-controller-manager", "kube-scheduler", "kwok"):
            self._wait_healthy(name)
        self._wait_default_service_account()

    def _wait_healthy(self, name: str) -> None:
        """One of the components _start_controllers runs, answering on its /healthz."""
        ports = self._layout.ports
        url = {"kube-controller-manager": f"https://127.0.0.1:{ports.controller_manager}/healthz",
               "kube-scheduler": f"https://127.0.0.1:{ports.scheduler}/healthz",
               "kwok": f"http://127.0.0.1:{ports.kwok}/healthz"}[name]
        self._components[name].wait_healthy(url, timeout=self.startup_timeout)

    def stop(self) -> None:
        """Stops every process and removes the temp dir.

        The dir is kept if MLSCHED_E2E_KEEP=1 or start() failed (its logs explain why).
        """
        self._stop_components()
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        if self.workdir is not None and not self._keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def _stop_components(self) -> None:
        # Reverse order: clients first, etcd last, so nobody logs about a gone peer.
        for component in reversed(list(self._components.values())):
            component.stop()

    def restart_apiserver(self, *, crash: bool = False, down_s: float = 0.0,
                          while_down: Callable[[], None] | None = None) -> None:
        """Stops kube-apiserver and starts it again with the same flags and port.

        By default it is stopped gracefully (SIGTERM), as in a rolling restart;
        crash=True kills it with SIGKILL instead. It stays down at least `down_s`
        seconds (an outage long enough for a round to fall in it); `while_down` runs
        then (delete_from_storage: what changed while watches were down). Returns once
        /readyz is ok, KCM and the scheduler are restarted (see _restart_controllers) and
        kwok has renewed every node's Lease.
        """
        apiserver = self._components["kube-apiserver"]
        apiserver.stop(kill=crash)
        if while_down is not None:
            while_down()
        time.sleep(down_s)
        apiserver.start()
        back = datetime.datetime.now(datetime.timezone.utc)
        try:
            self._wait_apiserver()
        except ComponentError as err:
            raise ControlPlaneError(str(err)) from None
        self._restart_controllers()
        self._wait_leases_renewed(back)

    def _restart_controllers(self) -> None:
        """KCM and kube-scheduler started afresh once the API server is back. Left running,
        their watches come back only after client-go's backoff, which grows across failures
        (up to 30 s, doubled by jitter) and is reset only after 2 quiet minutes: a test's
        second restart within that time left KCM blind for longer than tests wait. Seen
        30 Nov 2026: a StatefulSet the operator scaled 15 s after such a restart had no pod
        90 s later, and KCM's garbage collector, rediscovering kinds every 30 s, held a test's
        teardown for 52-80 s. What is under test is the operator riding out the outage; the
        Kubernetes controllers doing their part afterwards is the precondition."""
        if "kube-controller-manager" not in self._components:
            return  # an apiserver-only plane
        for name in ("kube-controller-manager", "kube-scheduler"):
            self._components[name].stop()
            self._components[name].start()
            try:
                self._wait_healthy(name)
            except ComponentError as err:
                raise ControlPlaneError(str(err)) from None

    #: How long kwok may take to renew every node's Lease after an outage: it renews each
    #: every 10 s (a quarter of its 40 s), so two renewals' worth.
    LEASE_RENEWAL_S = 25.0

    def _wait_leases_renewed(self, since: datetime.datetime) -> None:
        """Every kwok node's Lease renewed after the API server came back, so the next test
        starts on the plane it was written for. A node whose Lease KCM sees lapse is marked
        NotReady with its pods, and kwok never makes such pods Ready again (a probe, 30 Nov
        2026: a 35 s outage left every pod NotReady for good). What KCM sees also lags kwok:
        its Lease watch backs off after an outage, which is why flags.controller_manager gives
        a longer grace than the default. This wait is for a kwok that really stops renewing:
        it is restarted (it takes every Lease again) and, if that does not help, the test
        fails here saying so."""
        if "kwok" not in self._components:
            return
        stale = self._stale_leases_after_renewal(since)
        if not stale:
            return
        kwok = self._components["kwok"]
        print(f"[controlplane] kwok renewed no Lease of {stale} within {self.LEASE_RENEWAL_S:.0f} s "
              f"of the API server's restart: restarting kwok (log: {kwok.log_path})", flush=True)
        restarted = datetime.datetime.now(datetime.timezone.utc)
        kwok.stop()
        kwok.start()
        self._wait_healthy("kwok")
        stale = self._stale_leases_after_renewal(restarted)
        if stale:
            raise ControlPlaneError(f"kwok renewed no Lease of {stale} after the API server's "
                                    f"restart, nor after its own; kwok log: {kwok.log_path}")

    def _stale_leases_after_renewal(self, since: datetime.datetime) -> list[str]:
        """The kwok nodes whose Lease is still not renewed since `since` once LEASE_RENEWAL_S
        has passed (none as soon as every one is)."""
        deadline = time.monotonic() + self.LEASE_RENEWAL_S
        while (stale := fake_nodes.stale_leases(self._admin_client(), since)) \
                and time.monotonic() < deadline:
            time.sleep(1.0)
        return stale

    def delete_from_storage(self, key: str) -> int:
        """Delete an object's key (`/registry/pods/<namespace>/<name>`) in etcd itself, through
        etcd's JSON gateway: with the API server down, an object gone without a watch event
        (as one deleted during an outage the watches could not resume across). The count
        deleted."""
        assert self._layout is not None, "the control plane is not running"
        body = json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self._layout.ports.etcd}/v3/kv/deleterange", data=body,
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(json.loads(response.read()).get("deleted") or 0)

    @property
    def audit_log_path(self) -> Path:
        """The apiserver's audit log (JSON lines), when started with an audit_policy."""
        assert self.workdir is not None and self.audit_policy is not None
        return flags.audit_log_path(self._layout)

    @property
    def ca_cert_path(self) -> Path:
        """The cluster CA: it signed the apiserver's certificate."""
        return self._layout.pki.ca_cert

    def kubeconfig_for(self, user: str) -> Path:
        """The kubeconfig of one of credentials.py's users (the real node's components)."""
        return self._layout.creds.kubeconfig(user)

    def component_log(self, name: str) -> Path:
        return self._components[name].log_path

    # ----------------------------------------------------------------- clients

    def api_client(self) -> client.ApiClient:
        """A new kubernetes ApiClient authenticated as the cluster admin."""
        return config.new_client_from_config(config_file=str(self.kubeconfig_path))

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """kubectl (built with the control plane, same version) as the cluster admin, as a
        user would run it; its output is returned as text."""
        assert self.bin_dir is not None and self.kubeconfig_path is not None
        result = subprocess.run([str(self.bin_dir / "kubectl"), "--kubeconfig",
                                 str(self.kubeconfig_path), *args],
                                capture_output=True, text=True, timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n"
                                 f"{result.stdout}{result.stderr}")
        return result

    # ----------------------------------------------------------------- nodes

    def create_nodes(self, count: int, cpu: int = 8, gpu: int = 2, memory_gib: int = 48,
                     prefix: str = "kwok-node", *, wait: bool = True,
                     timeout: float = 60.0) -> list[str]:
        """Creates `count` kwok nodes named prefix-<n>; by default waits until they are Ready."""
        core = self._core()
        names = []
        for _ in range(count):
            serial = self._node_serial
            self._node_serial += 1
            name = f"{prefix}-{serial}"
            core.create_node(fake_nodes.node_manifest(
                name, serial, cpu=cpu, gpu=gpu, memory_gib=memory_gib))
            names.append(name)
        if wait:
            self._wait_nodes(core, names, "True", timeout)
        return names

    def set_node_ready(self, name: str, ready: bool, timeout: float = 60.0) -> None:
        """Makes a kwok node NotReady (ready=False) or Ready again, and waits for it.

        kwok then reports Ready=False (reason E2ENodeNotReady) until ready=True;
        its lease stays fresh, so the node looks like one whose kubelet says
        "not ready" rather than one that vanished. The rest is Kubernetes'
        own reaction: KCM taints the node node.kubernetes.io/not-ready
        (NoSchedule at once, NoExecute soon after), the scheduler stops placing
        pods there, and pods on it are evicted once their not-ready toleration
        (300 s by default) runs out.
        """
        core = self._core()
        fake_nodes.set_not_ready_annotation(core, name, not ready)
        self._wait_nodes(core, [name], "True" if ready else "False", timeout)

    def _wait_nodes(self, core: client.CoreV1Api, names: list[str], status: str,
                    timeout: float) -> None:
        try:
            fake_nodes.wait_ready_status(core, names, status, timeout)
        except TimeoutError as err:
            kwok = self._components["kwok"]
            raise ControlPlaneError(f"{err}\nkwok log: {kwok.log_path}") from None

    # ----------------------------------------------------------------- internals

    def _admin_client(self) -> client.ApiClient:
        if self._admin is None:
            self._admin = self.api_client()
        return self._admin

    def _core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self._admin_client())

    def _add(self, name: str, args: list[str]) -> None:
        assert self.workdir is not None and self.bin_dir is not None
        component = Component(name, [str(self.bin_dir / name), *args],
                              self.workdir / "logs" / f"{name}.log")
        self._components[name] = component
        component.start()

    def _wait_apiserver(self) -> None:
        self._components["kube-apiserver"].wait_healthy(
            f"{self.apiserver_url}/readyz", timeout=self.startup_timeout,
            token=self._layout.creds.tokens[credentials.ADMIN], ca_file=self._layout.pki.ca_cert)

    def _wait_default_service_account(self) -> None:
        # KCM's serviceaccount controller creates "default" in every namespace;
        # until it has, pods in that namespace are rejected by admission.
        core = self._core()
        kcm = self._components["kube-controller-manager"]
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if core.list_namespaced_service_account(
                    "default", field_selector="metadata.name=default").items:
                return
            if not kcm.running():
                break
            time.sleep(0.5)
        raise ControlPlaneError(str(kcm.fail("no default ServiceAccount in namespace default")))


class ApiServerPlane(ControlPlane):
    """etcd and kube-apiserver only, as envtest runs them (the apiserver-only tier,
    e2e/apiserver/): the same PKI, flags, credentials, kubectl and clients, but no
    kube-controller-manager, no scheduler, no kwok. The API server still does everything of
    its own: schemas, CEL, strict field validation, defaulting, admission, authentication,
    authorization (RBAC, SubjectAccessReviews), TokenRequests, status subresources,
    server-side dry runs. What KCM would do does not happen: no pods from StatefulSets, no
    `default` ServiceAccount, no ClusterRole aggregation, and a deleted namespace stays
    Terminating (harmless: the plane goes with the session)."""

    def _start_all(self) -> None:
        self._start_apiserver()

    def create_nodes(self, *args, **kwargs) -> list[str]:
        raise ControlPlaneError("an ApiServerPlane runs no kwok: a test that needs nodes "
                                "belongs in the full control plane's tier (e2e/test_*.py, "
                                "not e2e/apiserver/)")

    def set_node_ready(self, *args, **kwargs) -> None:
        self.create_nodes()
