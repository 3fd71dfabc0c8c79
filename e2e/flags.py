"""The command-line flags of each control-plane component.

They follow controller-runtime's envtest (loopback only, one temp dir) and
kubeadm (RBAC, ServiceAccount keys, per-controller credentials), with every
controller and no leader election.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import credentials
import fake_nodes
from credentials import Credentials
from pki import Pki

SERVICE_CIDR = "10.96.0.0/16"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
KWOK_STAGES = Path(__file__).resolve().parent / "kwok_stages.yaml"


@dataclass(frozen=True)
class Ports:
    etcd: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int


@dataclass(frozen=True)
class Layout:
    """Everything the flags point at."""
    workdir: Path
    ports: Ports
    pki: Pki
    creds: Credentials
    # Where the apiserver serves: loopback, or the real node's bridge address (e2e/real_node.py),
    # which its pods reach through the `kubernetes` Service.
    address: str = "127.0.0.1"


def etcd(layout: Layout) -> list[str]:
    client_url = f"http://127.0.0.1:{layout.ports.etcd}"
    peer_url = f"http://127.0.0.1:{layout.ports.etcd_peer}"
    return [
        "--name=e2e",
        f"--data-dir={layout.workdir / 'etcd'}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=e2e={peer_url}",
        # Test data need not survive a power cut; fsync is most of etcd's latency.
        "--unsafe-no-fsync=true",
        "--log-level=warn",
    ]


def apiserver(layout: Layout) -> list[str]:
    pki = layout.pki
    return [
        f"--etcd-servers=http://127.0.0.1:{layout.ports.etcd}",
        f"--bind-address={layout.address}",
        f"--advertise-address={layout.address}",
        f"--secure-port={layout.ports.apiserver}",
        f"--cert-dir={layout.workdir / 'apiserver-certs'}",
        f"--tls-cert-file={pki.serving_cert}",
        f"--tls-private-key-file={pki.serving_key}",
        f"--client-ca-file={pki.ca_cert}",
        f"--token-auth-file={layout.creds.token_file}",
        "--authorization-mode=Node,RBAC",
        # Bound ServiceAccount tokens (TokenRequest, TokenReview) need all three.
        f"--service-account-issuer={SA_ISSUER}",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allow-privileged=true",
        # The `kubernetes` Service cannot point at a loopback address; with the
        # default reconciler the apiserver logs that error every few seconds. Served on the real
        # node's bridge, the default reconciler points it there, for pods in that node.
        *(["--endpoint-reconciler-type=none"] if layout.address == "127.0.0.1" else []),
        # `kubectl logs` and `exec` on the real node: the apiserver dials the node's InternalIP
        # (its name resolves nowhere) with a client certificate the kubelet checks.
        "--kubelet-preferred-address-types=InternalIP",
        f"--kubelet-client-certificate={pki.kubelet_client_cert}",
        f"--kubelet-client-key={pki.kubelet_client_key}",
        # On SIGTERM, drain ordinary requests (answering 429 + Retry-After) and
        # then give open watches 2 s. Without it the HTTP server waits up to
        # --request-timeout (60 s) for watch connections to go idle.
        "--shutdown-send-retry-after=true",
    ]


def audit_log_path(layout: Layout) -> Path:
    return layout.workdir / "logs" / "audit.log"


def audit(layout: Layout, policy: dict) -> list[str]:
    """Audit logging to a file, for the requests `policy` selects (ControlPlane(audit_policy=))."""
    policy_file = layout.workdir / "audit-policy.yaml"
    policy_file.write_text(json.dumps(policy))  # JSON is YAML
    return [
        f"--audit-policy-file={policy_file}",
        f"--audit-log-path={audit_log_path(layout)}",
        "--audit-log-format=json",
        # Written before the response is sent, so the log is complete when a test reads it.
        "--audit-log-mode=blocking",
    ]


def _kubeconfig_flags(layout: Layout, user: str) -> list[str]:
    kubeconfig = layout.creds.kubeconfig(user)
    # The authn/authz kubeconfigs let the component check who calls its own
    # HTTPS endpoint instead of logging that it cannot.
    return [f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}"]


def controller_manager(layout: Layout) -> list[str]:
    pki = layout.pki
    return [
        *_kubeconfig_flags(layout, credentials.CONTROLLER_MANAGER),
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        f"--secure-port={layout.ports.controller_manager}",
        f"--cert-dir={layout.workdir / 'kcm-certs'}",
        # Each controller acts as its own ServiceAccount, as under kubeadm; KCM's
        # own identity only has the rights to mint those tokens.
        "--use-service-account-credentials=true",
        # The serviceaccount-token controller signs legacy token Secrets with
        # this key; the root CA goes into every namespace's kube-root-ca.crt.
        f"--service-account-private-key-file={pki.sa_key}",
        f"--root-ca-file={pki.ca_cert}",
        f"--cluster-signing-cert-file={pki.ca_cert}",
        f"--cluster-signing-key-file={pki.ca_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # How long a node's Lease may go unrenewed before its node and pods are marked
        # NotReady (40-50 s by default). After an API server restart KCM's Lease watch comes
        # back with the reflector's backoff (up to 30 s), so on a loaded 2-core machine an 8 s
        # outage once read as a lapse (CI, 30 Nov 2026). kwok then makes the node Ready again
        # (its node-initialize Stage) but, unlike a kubelet, never re-asserts its pods'
        # readiness: they stayed NotReady for good and the next test waited in vain. No test
        # expects a lapsed Lease to be noticed; a node is made NotReady by annotation
        # (ControlPlane.set_node_ready), which does not wait on this.
        "--node-monitor-grace-period=180s",
    ]


def scheduler(layout: Layout) -> list[str]:
    return [
        *_kubeconfig_flags(layout, credentials.SCHEDULER),
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        f"--secure-port={layout.ports.scheduler}",
    ]


def kwok(layout: Layout) -> list[str]:
    annotation, value = fake_nodes.KWOK_ANNOTATION
    return [
        f"--kubeconfig={layout.creds.kubeconfig(credentials.KWOK)}",
        # kwok has no built-in lifecycle: without Stages it does nothing.
        f"--config={KWOK_STAGES}",
        # Only nodes that ask for it are faked; anything else is left alone.
        f"--manage-nodes-with-annotation-selector={annotation}={value}",
        # kwok renews each node's Lease, which is what KCM reads as the heartbeat.
        "--node-lease-duration-seconds=40",
        "--node-ip=127.0.0.1",
        f"--server-address=127.0.0.1:{layout.ports.kwok}",
    ]
