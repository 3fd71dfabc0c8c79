"""Run a training program as a pod would, on this machine, without a container runtime.

What a pod's process sees and what this gives it:

- its environment, resolved from the Pod object as the kubelet does (`pod_env`): fieldRefs,
  then `$(VAR)` references to variables defined earlier in the list; command and args too;
- its own hostname (the pod name) and an /etc/hosts mapping every pod of the job, by its DNS
  name (`JOB-worker-0.JOB.NS.svc`) and its short name, to a loopback address of its own
  (127.0.0.2, 127.0.0.3, ...: all of 127.0.0.0/8 is loopback on Linux), as cluster DNS and the
  kubelet's /etc/hosts map them to pod IPs. Each pod is a process in its own mount and UTS
  namespace (`unshare --mount --uts`, util-linux; needs root, as CI has), so hostname and
  /etc/hosts are its alone, and its mounts vanish with it;
- its volumes: a host directory bind-mounted at each volumeMount whose volume is given
  (`volumes={"checkpoint": dir}`), and the progress token at its projected volume's mountPath;
- the kubelet's stop: SIGTERM, the pod's terminationGracePeriodSeconds (30 s by default), then
  SIGKILL (`PodProcess.terminate`).

The network namespace stays the host's, so traffic never leaves loopback but listening
sockets are shared: two pods cannot bind the same port on all addresses (torch's TCPStore
does), as two pods of one job never need to; two jobs running at once (tests on two xdist
workers) must name different rendezvous ports (test_operator_training.py does). gloo picks its address from the hostname (it
resolves it and binds there), so each pod's gloo listens on its own 127.0.0.x; connecting
sockets get 127.0.0.1 as their source (the kernel's choice for loopback routes), where a real
pod's would carry its pod IP: no program here checks the peer's source address.
"""

from __future__ import annotations

import ctypes
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
STS_POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
DEFAULT_GRACE_S = 30  # the pod default of terminationGracePeriodSeconds
# What a container gets when its image sets no PATH (the container runtimes' default).
CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class PodRunnerError(RuntimeError):
    pass


# ------------------------------------------------------------------------ the environment


def expand(text: str, defined: Mapping[str, str]) -> str:
    """Kubernetes' dependent variables: `$(NAME)` becomes NAME's value when NAME is defined,
    `$$` becomes `$`, anything else (an unknown name, an unclosed `$(`) stays as written."""
    out, i = [], 0
    while i < len(text):
        if text[i] != "$" or i + 1 == len(text):
            out.append(text[i])
            i += 1
        elif text[i + 1] == "$":
            out.append("$")
            i += 2
        elif text[i + 1] == "(" and (end := text.find(")", i + 2)) != -1:
            name = text[i + 2:end]
            out.append(defined[name] if name in defined else text[i:end + 1])
            i = end + 1
        else:  # `$x` or an unclosed `$(`: both characters kept
            out.append(text[i:i + 2])
            i += 2
    return "".join(out)


def field_ref(pod: Mapping[str, Any], path: str) -> str:
    """The fieldRef paths the downward API allows for env (those a test pod can have)."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    for prefix, source in (("metadata.labels", meta.get("labels")),
                           ("metadata.annotations", meta.get("annotations"))):
        if path.startswith(prefix + "['") and path.endswith("']"):
            return (source or {}).get(path[len(prefix) + 2:-2], "")
    simple = {"metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace"),
              "metadata.uid": meta.get("uid"), "spec.nodeName": spec.get("nodeName"),
              "spec.serviceAccountName": spec.get("serviceAccountName"),
              "status.podIP": status.get("podIP"), "status.hostIP": status.get("hostIP")}
    if path not in simple:
        raise PodRunnerError(f"fieldRef {path!r} is not supported by this runner")
    return simple[path] or ""


def container_of(pod: Mapping[str, Any], container: int | str = 0) -> dict[str, Any]:
    containers = (pod.get("spec") or {}).get("containers") or []
    if isinstance(container, int):
        return containers[container]
    return next(c for c in containers if c.get("name") == container)


def pod_env(pod: Mapping[str, Any], container: int | str = 0) -> dict[str, str]:
    """A container's environment as the kubelet resolves it, in order: each `value` expanded
    against the variables defined before it, each fieldRef read from the Pod object. Other
    sources (Secrets, ConfigMaps, resourceFieldRef) are not needed by mlsched's rendering and
    fail loudly rather than resolve wrong."""
    env: dict[str, str] = {}
    for var in container_of(pod, container).get("env") or ():
        name = var["name"]
        if "valueFrom" in var:
            ref = var["valueFrom"].get("fieldRef")
            if ref is None:
                raise PodRunnerError(f"{name}: only valueFrom.fieldRef is supported, got "
                                     f"{sorted(var['valueFrom'])}")
            env[name] = field_ref(pod, ref["fieldPath"])
        else:
            env[name] = expand(var.get("value", ""), env)
    return env


def pod_argv(pod: Mapping[str, Any], env: Mapping[str, str], container: int | str = 0) -> list[str]:
    """command + args, with `$(VAR)` expanded as the kubelet does. No image here: a container
    without a command cannot run."""
    spec = container_of(pod, container)
    if not spec.get("command"):
        raise PodRunnerError(f"{pod['metadata']['name']}: the container needs a command "
                             "(there is no image entrypoint here)")
    return [expand(a, env) for a in [*spec["command"], *(spec.get("args") or ())]]


def statefulset_pods(statefulset: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The Pods the StatefulSet controller would create: name SET-k, the ordinal label, and
    hostname/subdomain so that the pod's DNS name is SET-k.SERVICE.NS.svc."""
    meta, spec = statefulset["metadata"], statefulset["spec"]
    pods = []
    for k in range(spec["replicas"]):
        template = spec["template"]
        name = f"{meta['name']}-{k}"
        labels = {**(template.get("metadata") or {}).get("labels", {}),
                  POD_INDEX_LABEL: str(k), STS_POD_NAME_LABEL: name}
        pod_spec = {**template["spec"], "hostname": name, "subdomain": spec["serviceName"]}
        pods.append({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": name, "namespace": meta["namespace"], "labels": labels},
                     "spec": pod_spec})
    return pods


# ------------------------------------------------------------------------ names and addresses


def pod_names(pod: Mapping[str, Any]) -> list[str]:
    """The names a pod answers to: its DNS names through its Service, then its short name."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    host = spec.get("hostname") or meta["name"]
    names = []
    if spec.get("subdomain"):
        fqdn = f"{host}.{spec['subdomain']}.{meta['namespace']}.svc"
        names += [fqdn, f"{fqdn}.cluster.local"]
    return [*names, host]


def addresses(pods: Sequence[Mapping[str, Any]], first: int = 2) -> dict[str, str]:
    """A loopback address per pod, in order (127.0.0.1 stays `localhost`)."""
    if first + len(pods) > 255:
        raise PodRunnerError("more pods than addresses in 127.0.0.0/24")
    return {p["metadata"]["name"]: f"127.0.0.{first + i}" for i, p in enumerate(pods)}


def hosts_file(pods: Sequence[Mapping[str, Any]], address: Mapping[str, str]) -> str:
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{address[p['metadata']['name']]}\t{' '.join(pod_names(p))}" for p in pods]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------ processes


def _die_with_parent() -> None:
    # A test killed hard runs no teardown; the kernel then kills its pods too.
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class PodProcess:
    pod: dict[str, Any]
    address: str
    log_path: Path
    process: subprocess.Popen
    started_at: float = field(default_factory=time.monotonic)
    terminated_at: float | None = None  # when SIGTERM was sent

    @property
    def name(self) -> str:
        return self.pod["metadata"]["name"]

    @property
    def grace_s(self) -> float:
        grace = (self.pod.get("spec") or {}).get("terminationGracePeriodSeconds")
        return DEFAULT_GRACE_S if grace is None else grace

    def running(self) -> bool:
        return self.process.poll() is None

    def signal_term(self) -> None:
        if self.running():
            self.terminated_at = time.monotonic()
            self.process.send_signal(signal.SIGTERM)

    def wait(self, timeout: float | None = None) -> int:
        """The exit status; PodRunnerError with the log's tail when it does not end in time."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise PodRunnerError(f"{self.name} still running after {timeout} s; log "
                                 f"{self.log_path}:\n{self.log(tail=30)}") from None

    def terminate(self, grace_s: float | None = None) -> int:
        """What the kubelet does when a pod is deleted: SIGTERM, the grace period, SIGKILL."""
        self.signal_term()
        try:
            return self.process.wait(self.grace_s if grace_s is None else grace_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def log(self, tail: int | None = None) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-tail:] if tail else lines)


def terminate_all(pods: Iterable[PodProcess], grace_s: float | None = None, *,
                  signalled: Iterable[PodProcess] | None = None) -> list[int]:
    """SIGTERM to `signalled` (default: every pod, as deleting them together does), then each
    pod gets its grace period (from now) to exit before SIGKILL. The exit statuses, in order
    (-9: killed)."""
    pods = list(pods)
    for p in pods if signalled is None else signalled:
        p.signal_term()
    deadline = time.monotonic() + max(grace_s if grace_s is not None else p.grace_s for p in pods)
    codes = []
    for p in pods:
        try:
            codes.append(p.process.wait(max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            p.process.kill()
            codes.append(p.process.wait())
    return codes


class PodRunner:
    """Starts pods and cleans up after them: `with PodRunner() as runner: runner.start(pods)`.
    Its temp dir holds the pods' logs, /etc/hosts files and tokens."""

    def __init__(self, workdir: str | os.PathLike | None = None):
        if shutil.which("unshare") is None:
            raise PodRunnerError("`unshare` not found: install util-linux")
        if os.geteuid() != 0:
            raise PodRunnerError("pod_runner needs root (mount and UTS namespaces)")
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="pods-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.pods: list[PodProcess] = []
        self._starts = 0

    def __enter__(self) -> PodRunner:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @staticmethod
    def _mount_point(path: Path) -> None:
        # A container runtime creates mount points inside the container's root; here the root
        # is the host's, so a missing one is created (empty) and left there. Not removed: the
        # full plane runs test modules on several xdist workers at once, and another worker's
        # runner may have pods mounted at the same path (the token's, the checkpoint's);
        # removing a directory detaches what is mounted on it in every mount namespace (Linux
        # 3.18 on), and those pods lost their token mid-run (docs/e2e.md, "Three planes at
        # once").
        path.mkdir(parents=True, exist_ok=True)

    def start(self, pods: Sequence[Mapping[str, Any]], *,
              peers: Sequence[Mapping[str, Any]] | None = None,
              volumes: Mapping[str, str | os.PathLike] | None = None,
              token: str | None = None, tokens: Mapping[str, str] | None = None,
              container: int | str = 0) -> list[PodProcess]:
        """Starts `pods`; each sees every pod of `peers` (default: `pods`) in its /etc/hosts,
        so start a job's pods together or name them all as peers. `volumes`: volume name ->
        host directory, bind-mounted wherever the container mounts it. `token` (every pod) or
        `tokens` (pod name -> token): what the kubelet would project into the pod's
        serviceAccountToken volume."""
        self._starts += 1
        everyone = list(peers if peers is not None else pods)
        # By name, so that a pod keeps its address whichever order the caller lists them in.
        everyone.sort(key=lambda p: p["metadata"]["name"])
        address = addresses(everyone)
        started = []
        for pod in pods:
            name = pod["metadata"]["name"]
            if name not in address:
                raise PodRunnerError(f"{name} is not among its peers")
            base = self.workdir / f"{name}.{self._starts}"
            base.mkdir()
            hosts = base / "hosts"
            hosts.write_text(hosts_file(everyone, address))
            own_token = (tokens or {}).get(name, token)
            mounts = self._mounts(pod, dict(volumes or {}), own_token, base, container)
            env = pod_env(pod, container)
            argv = pod_argv(pod, env, container)
            hostname = (pod.get("spec") or {}).get("hostname") or name
            full_env = {"PATH": CONTAINER_PATH, "HOSTNAME": hostname, "HOME": "/root", **env}
            script = ["set -e", f"mount --bind {shlex.quote(str(hosts))} /etc/hosts",
                      f"hostname {shlex.quote(hostname)}"]
            for source, target, read_only in mounts:
                script.append(f"mount --bind {shlex.quote(str(source))} {shlex.quote(target)}")
                if read_only:
                    script.append(f"mount -o remount,bind,ro {shlex.quote(target)}")
            script.append('exec "$@"')
            workdir = container_of(pod, container).get("workingDir") or "/"
            log_path = base / "log"
            with open(log_path, "wb") as log:
                # unshare execs sh, which execs the program: one pid, so the SIGTERM sent to
                # it reaches the program itself, as the kubelet's reaches PID 1.
                process = subprocess.Popen(
                    ["unshare", "--mount", "--uts", "--propagation", "private", "sh", "-c",
                     "\n".join(script), "pod", *argv],
                    env=full_env, cwd=workdir, stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
            started.append(PodProcess(pod=dict(pod), address=address[name], log_path=log_path,
                                      process=process))
        self.pods += started
        return started

    def _mounts(self, pod: Mapping[str, Any], volumes: dict[str, Any], token: str | None,
                base: Path, container: int | str) -> list[tuple[Path, str, bool]]:
        if token is not None:
            for volume in (pod.get("spec") or {}).get("volumes") or ():
                sources = (volume.get("projected") or {}).get("sources") or ()
                for source in sources:
                    if "serviceAccountToken" in source:
                        (base / "token").mkdir()
                        path = source["serviceAccountToken"].get("path", "token")
                        (base / "token" / path).write_text(token)
                        volumes.setdefault(volume["name"], base / "token")
        out = []
        for mount in container_of(pod, container).get("volumeMounts") or ():
            if mount["name"] in volumes:
                self._mount_point(Path(mount["mountPath"]))
                out.append((Path(volumes[mount["name"]]), mount["mountPath"],
                            bool(mount.get("readOnly"))))
        return out

    def close(self) -> None:
        """Kills what still runs (a test that failed half-way). The logs stay in `workdir`
        for the report; the mount points stay (_mount_point)."""
        for p in self.pods:
            if p.running():
                p.process.kill()
                p.process.wait()
