"""One real node in the e2e cluster: containerd and runc run the pods' containers, the kubelet
and kube-proxy of the control plane's Kubernetes version manage them, CoreDNS answers the
cluster's names. kwok's nodes stay for scale; this node is where containers really start.

Everything stays on this machine. The harness makes a Linux bridge (`mlsched0`, 10.244.0.1/24)
before the control plane starts; the bridge's address is the node's InternalIP and the address
the apiserver serves on (ControlPlane(address=...)), so that pods reach it through the
`kubernetes` Service. Pods get addresses on that bridge from the CNI plugins `bridge` and
`host-local`, with no masquerading and no route off the machine. kube-proxy (iptables) makes
Services work; CoreDNS runs as a process on the bridge address and the `kube-dns` Service
points at it, as a cluster's DNS Service points at its CoreDNS pods.

What this machine needs, each found out by trying (issue 49's notes):
- containerd's sandbox (pause) image must be local: registry.k8s.io cannot be pulled. The
  pause image is built here (e2e/build_images.sh).
- `restrict_oom_score_adj`: root here lacks CAP_SYS_RESOURCE, so the pause container's
  oom_score_adj of -998 is refused ("can't get final child's PID from pipe: EOF" from runc).
- The kubelet on a cgroup v1 hierarchy with cgroupfs (`failCgroupV1: false`).
- kube-proxy must not set conntrack sysctls (`--conntrack-max-per-core=0`).

Needs root and Debian's containerd, runc, containernetworking-plugins, iptables and iproute2;
a missing one is an error that says what to install.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import yaml
from kubernetes import client

import credentials
from processes import Component

BRIDGE = "mlsched0"
ADDRESS = "10.244.0.1"  # the bridge's: the node's InternalIP and the apiserver's address
POD_SUBNET = "10.244.0.0/24"
DNS_SERVICE_IP = "10.96.0.10"  # in the control plane's service CIDR (flags.SERVICE_CIDR)
CLUSTER_DOMAIN = "cluster.local"
NAME = credentials.REAL_NODE
CNI_BIN = Path("/usr/lib/cni")
K8S_NAMESPACE = "k8s.io"  # containerd's namespace for the CRI's containers and images
COREDNS_ROLE = "system:coredns"
IMPORT_TIMEOUT_S = 1200  # `ctr images import` of one archive: a guard against a hang

_PACKAGES = {
    "containerd": "containerd", "ctr": "containerd", "runc": "runc",
    "iptables": "iptables", "ip": "iproute2",
}


class RealNodeError(RuntimeError):
    pass


def check_requirements() -> None:
    """Root and the Debian packages the node runs on, or an error naming what to install."""
    if os.geteuid() != 0:
        raise RealNodeError("the real node's containerd, kubelet and bridge need root")
    missing = sorted({package for tool, package in _PACKAGES.items() if shutil.which(tool) is None})
    if not (CNI_BIN / "bridge").exists():
        missing.append("containernetworking-plugins")
    if missing:
        raise RealNodeError("the real node needs Debian packages that are not installed: "
                            f"apt-get install -y {' '.join(missing)}")


def _run(*argv: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise RealNodeError(f"{' '.join(argv)} failed ({result.returncode}): "
                            f"{result.stderr.strip() or result.stdout.strip()}")
    return result


def make_bridge() -> None:
    """The node's network, made before the control plane starts (the apiserver binds its
    address). A bridge left by an earlier run that was killed is replaced."""
    check_requirements()
    if _run("ip", "link", "show", BRIDGE, check=False).returncode == 0:
        _run("ip", "link", "delete", BRIDGE)
    _run("ip", "link", "add", BRIDGE, "type", "bridge")
    _run("ip", "addr", "add", f"{ADDRESS}/24", "dev", BRIDGE)
    _run("ip", "link", "set", BRIDGE, "up")


def remove_bridge() -> None:
    _run("ip", "link", "delete", BRIDGE, check=False)


# The chains the kubelet itself writes (kube-proxy --cleanup removes kube-proxy's): its canary,
# the hint for which iptables backend is in use, and the rule dropping outside packets to
# 127.0.0.0/8.
KUBELET_CHAINS = ("KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT")


def remove_kubelet_rules() -> None:
    for tool in ("iptables", "ip6tables"):
        if shutil.which(tool) is None:
            continue
        for table in ("filter", "nat", "mangle", "raw"):
            rules = _run(tool, "-t", table, "-S", check=False).stdout.splitlines()
            for rule in rules:  # the jumps into them first: a chain in use cannot go
                words = rule.split()
                if words[:1] == ["-A"] and any(f"-j {c}" in rule for c in KUBELET_CHAINS):
                    _run(tool, "-t", table, "-D", *words[1:], check=False)
            for chain in KUBELET_CHAINS:
                if f"-N {chain}" in rules:
                    _run(tool, "-t", table, "-F", chain, check=False)
                    _run(tool, "-t", table, "-X", chain, check=False)


class RealNode:
    """Start with start(plane, images) once the plane runs; stop() undoes everything, leaving
    no process, mount, iptables rule or interface behind."""

    def __init__(self, workdir: Path, bin_dir: Path, coredns: str):
        self.workdir = workdir
        self.bin_dir = bin_dir
        self.coredns_binary = coredns
        self.socket = workdir / "containerd" / "containerd.sock"
        self.log_dir = workdir / "logs"
        self.pod_logs = workdir / "pod-logs"
        self._components: dict[str, Component] = {}

    # ------------------------------------------------------------------ lifecycle

    def start(self, plane, images: list[Path], timeout: float = 180.0) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._start_containerd(timeout)
        for archive in images:
            # The training image is 3.3 GB (PyPI's torch carries CUDA's libraries): about
            # 2 minutes to import on a quiet 2-core machine, over 5 once when the machine was
            # loaded three times over. The limit is a guard against a hang, not a deadline.
            self.ctr("images", "import", str(archive), timeout=IMPORT_TIMEOUT_S)
        self._start_kubelet(plane.kubeconfig_for(credentials.KUBELET), plane.ca_cert_path)
        self._start_kube_proxy(plane.kubeconfig_for(credentials.KUBE_PROXY))
        api = plane.api_client()
        try:
            self._install_dns(api, plane.kubeconfig_for(credentials.COREDNS), timeout)
            self._wait_ready(client.CoreV1Api(api), timeout)
        finally:
            api.close()

    def stop(self) -> None:
        kubelet = self._components.pop("kubelet", None)
        if kubelet is not None:
            kubelet.stop()
        if "containerd" in self._components:
            self._kill_containers()
        for component in reversed(list(self._components.values())):
            component.stop()
        self._components.clear()
        # The iptables rules kube-proxy wrote, its chains and all.
        kube_proxy = self.bin_dir / "kube-proxy"
        if kube_proxy.exists():
            _run(str(kube_proxy), "--cleanup", check=False)
        self._kill_shims()
        self._unmount_all()
        remove_kubelet_rules()

    # ------------------------------------------------------------------ containerd

    def ctr(self, *args: str, timeout: float = 300) -> str:
        return _run("ctr", "--address", str(self.socket), "--namespace", K8S_NAMESPACE,
                    *args, timeout=timeout).stdout

    def _start_containerd(self, timeout: float) -> None:
        base = self.workdir / "containerd"
        cni_conf = base / "cni"
        cni_conf.mkdir(parents=True, exist_ok=True)
        (cni_conf / "10-mlsched.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "mlsched-e2e",
            "plugins": [
                {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False,
                 "hairpinMode": True,
                 "ipam": {"type": "host-local", "dataDir": str(base / "ipam"),
                          "ranges": [[{"subnet": POD_SUBNET, "gateway": ADDRESS}]],
                          "routes": [{"dst": "0.0.0.0/0"}]}},
                {"type": "portmap", "capabilities": {"portMappings": True}},
                {"type": "loopback"},
            ]}, indent=1))
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        config = base / "config.toml"
        config.write_text(f"""version = 2
root = "{base / 'root'}"
state = "{base / 'state'}"
[grpc]
  address = "{self.socket}"
[{cri}]
  sandbox_image = "localhost/mlsched-pause:e2e"
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [{cri}.cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{cni_conf}"
""")
        self._add("containerd", ["containerd", "--config", str(config)])
        deadline = time.monotonic() + timeout
        while not self.socket.exists():
            if not self._components["containerd"].running() or time.monotonic() > deadline:
                raise self._components["containerd"].fail("no socket")
            time.sleep(0.2)

    def _kill_containers(self) -> None:
        """Every container of every pod, killed, so that nothing outlives the node."""
        try:
            tasks = self.ctr("tasks", "list", "-q").split()
            for task in tasks:
                _run("ctr", "--address", str(self.socket), "--namespace", K8S_NAMESPACE,
                     "tasks", "kill", "--signal", "SIGKILL", task, check=False)
            time.sleep(1)
            for task in tasks:
                _run("ctr", "--address", str(self.socket), "--namespace", K8S_NAMESPACE,
                     "tasks", "delete", "--force", task, check=False)
        except (RealNodeError, subprocess.TimeoutExpired):
            pass  # containerd gone already: _kill_shims finds what is left

    def _kill_shims(self) -> None:
        """containerd's shims outlive containerd by design; this node's go with it."""
        needle = str(self.socket)
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "containerd-shim" in cmdline and needle in cmdline:
                try:
                    os.kill(int(proc.name), 9)
                except ProcessLookupError:
                    pass

    def _unmount_all(self) -> None:
        """Rootfs overlays, network namespaces and volumes under the node's dir, deepest
        first."""
        prefix = str(self.workdir)
        mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
        for target in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
            _run("umount", "--lazy", target, check=False)

    # ------------------------------------------------------------------ kubelet, kube-proxy

    def _start_kubelet(self, kubeconfig: Path, ca_cert: Path) -> None:
        resolv = self.workdir / "resolv.conf"
        # The upstream resolvers of pods with dnsPolicy Default: none (nothing outside resolves).
        resolv.write_text("")
        config = self.workdir / "kubelet.yaml"
        config.write_text(yaml.safe_dump({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "cgroupDriver": "cgroupfs", "failCgroupV1": False, "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "address": ADDRESS, "port": 10250, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
            # `kubectl logs`/`exec`: the apiserver's client certificate (pki.py), checked
            # against the cluster CA; what it may do, asked of the apiserver.
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(ca_cert)}},
            "authorization": {"mode": "Webhook"},
            "clusterDNS": [DNS_SERVICE_IP], "clusterDomain": CLUSTER_DOMAIN,
            "resolvConf": str(resolv),
            "podLogsDir": str(self.pod_logs),
            # A shared machine's disk: evict only when it is really full, never collect the
            # images the tests imported (nothing could pull them again).
            "evictionHard": {"nodefs.available": "1%", "imagefs.available": "1%",
                             "memory.available": "100Mi"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
        }))
        self._add("kubelet", [
            str(self.bin_dir / "kubelet"), f"--config={config}", f"--kubeconfig={kubeconfig}",
            f"--root-dir={self.workdir / 'kubelet'}", f"--node-ip={ADDRESS}",
            f"--hostname-override={NAME}", "--v=2",
        ])

    def _start_kube_proxy(self, kubeconfig: Path) -> None:
        self._add("kube-proxy", [
            str(self.bin_dir / "kube-proxy"), f"--kubeconfig={kubeconfig}",
            f"--hostname-override={NAME}", "--proxy-mode=iptables",
            f"--cluster-cidr={POD_SUBNET}",
            # Sysctls this machine does not let root set.
            "--conntrack-max-per-core=0",
            # NodePorts on the bridge only, never on the machine's own interfaces.
            f"--nodeport-addresses={ADDRESS}/32",
            "--metrics-bind-address=127.0.0.1:10249",
            "--healthz-bind-address=127.0.0.1:10256",
        ])

    # ------------------------------------------------------------------ DNS

    def _install_dns(self, api: client.ApiClient, kubeconfig: Path, timeout: float) -> None:
        rbac = client.RbacAuthorizationV1Api(api)
        rbac.create_cluster_role({
            "metadata": {"name": COREDNS_ROLE},
            "rules": [
                {"apiGroups": [""], "resources": ["services", "pods", "namespaces"],
                 "verbs": ["list", "watch"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                 "verbs": ["list", "watch"]},
            ]})
        rbac.create_cluster_role_binding({
            "metadata": {"name": COREDNS_ROLE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": COREDNS_ROLE},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                          "name": credentials.COREDNS}]})
        corefile = self.workdir / "Corefile"
        corefile.write_text(f"""{CLUSTER_DOMAIN}:53 {{
    bind {ADDRESS}
    errors
    health 127.0.0.1:18080
    ready 127.0.0.1:18181
    kubernetes {CLUSTER_DOMAIN} {{
        kubeconfig {kubeconfig} e2e
    }}
}}
""")
        self._add("coredns", [str(self.bin_dir / self.coredns_binary), "-conf", str(corefile)])
        self._components["coredns"].wait_healthy("http://127.0.0.1:18181/ready", timeout=timeout,
                                                 expect="OK")
        # The cluster's DNS Service, its endpoint the CoreDNS process on the bridge.
        core = client.CoreV1Api(api)
        ports = [{"name": "dns", "port": 53, "protocol": "UDP"},
                 {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]
        core.create_namespaced_service("kube-system", {
            "metadata": {"name": "kube-dns"},
            "spec": {"clusterIP": DNS_SERVICE_IP, "ports": ports}})
        client.DiscoveryV1Api(api).create_namespaced_endpoint_slice("kube-system", {
            "metadata": {"name": "kube-dns-coredns",
                         "labels": {"kubernetes.io/service-name": "kube-dns"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [ADDRESS], "conditions": {"ready": True}}],
            "ports": ports})

    # ------------------------------------------------------------------ internals

    def _wait_ready(self, core: client.CoreV1Api, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = "not registered"
        while time.monotonic() < deadline:
            if not self._components["kubelet"].running():
                raise self._components["kubelet"].fail("exited before the node was Ready")
            try:
                node = core.read_node(NAME)
                ready = [c for c in node.status.conditions or [] if c.type == "Ready"]
                if ready and ready[0].status == "True":
                    return
                last = f"Ready={ready[0].status} ({ready[0].message})" if ready else "no Ready"
            except client.ApiException as err:
                last = f"HTTP {err.status}"
            time.sleep(0.5)
        raise self._components["kubelet"].fail(f"node {NAME} not Ready after {timeout:.0f}s "
                                               f"(last: {last})")

    def _add(self, name: str, argv: list[str]) -> None:
        component = Component(name, argv, self.log_dir / f"{name}.log")
        self._components[name] = component
        component.start()

    def log(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

