"""Keys and certificates for the e2e control plane, made with the openssl CLI.

The harness may only depend on the standard library, the kubernetes client and
PyYAML, none of which can make RSA keys, so it shells out to openssl (Debian
package "openssl", present on every Debian machine that has ca-certificates).

What is made, as kubeadm would for a one-node cluster:
  ca.crt/ca.key                 cluster CA: signs the apiserver's serving cert,
                                verifies client certs, and is the root CA that
                                KCM publishes to every namespace (kube-root-ca.crt)
  apiserver.crt/apiserver.key   serving cert for 127.0.0.1 and the in-cluster names
                                (and the real node's bridge address, when there is one)
  kubelet-client.crt/.key       the apiserver's client cert towards kubelets (`kubectl
                                logs`, `exec`), in system:masters, as kubeadm makes it
  sa.key/sa.pub                 ServiceAccount token signing key and its public half
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

_DAYS = "30"
_SERVING_NAMES = ",".join([
    "IP:127.0.0.1",
    "IP:10.96.0.1",  # the first address of the service CIDR: the `kubernetes` service
    "DNS:localhost",
    "DNS:kubernetes",
    "DNS:kubernetes.default",
    "DNS:kubernetes.default.svc",
    "DNS:kubernetes.default.svc.cluster.local",
])


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    sa_key: Path
    sa_pub: Path
    kubelet_client_cert: Path
    kubelet_client_key: Path


def _openssl(*args: str) -> None:
    result = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed:\n{result.stderr}")


def _leaf(pki: Pki, subject: str, usage: str, key: Path, cert: Path, *extra: str) -> None:
    """A key and a certificate for `usage` (serverAuth, clientAuth) signed by the CA.
    OpenSSL >= 3.0: 'req -x509 -CA' makes and signs the leaf in one step."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", _DAYS,
             "-subj", subject, "-CA", str(pki.ca_cert), "-CAkey", str(pki.ca_key),
             "-addext", "basicConstraints=critical,CA:FALSE",
             "-addext", "keyUsage=critical,digitalSignature,keyEncipherment",
             "-addext", f"extendedKeyUsage={usage}", *extra,
             "-keyout", str(key), "-out", str(cert))


def make_pki(directory: Path, address: str = "127.0.0.1") -> Pki:
    """`address`: the one the apiserver serves on, when not loopback (e2e/real_node.py)."""
    if shutil.which("openssl") is None:
        raise RuntimeError(
            "the e2e control plane needs the openssl command to make its certificates: "
            "apt-get install openssl"
        )
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        serving_cert=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        sa_key=directory / "sa.key",
        sa_pub=directory / "sa.pub",
        kubelet_client_cert=directory / "kubelet-client.crt",
        kubelet_client_key=directory / "kubelet-client.key",
    )
    names = _SERVING_NAMES if address == "127.0.0.1" else f"{_SERVING_NAMES},IP:{address}"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", _DAYS,
             "-subj", "/CN=mlsched-e2e-ca",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
             "-keyout", str(pki.ca_key), "-out", str(pki.ca_cert))
    _leaf(pki, "/CN=kube-apiserver", "serverAuth", pki.serving_key, pki.serving_cert,
          "-addext", f"subjectAltName={names}")
    _leaf(pki, "/O=system:masters/CN=kube-apiserver-kubelet-client", "clientAuth",
          pki.kubelet_client_key, pki.kubelet_client_cert)
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
             "-out", str(pki.sa_key))
    _openssl("pkey", "-in", str(pki.sa_key), "-pubout", "-out", str(pki.sa_pub))
    return pki
