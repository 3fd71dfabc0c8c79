"""HTTPS for the progress endpoint without cert-manager: a CA and a serving certificate that the
operator keeps in a Secret of its own namespace (`--tls-secret namespace/name`).

At startup the operator reads the Secret; when it is missing, it makes a CA and a certificate
for the host of --progress-url, signed by that CA, and creates the Secret. A certificate that
expires within RENEW_BEFORE_DAYS, or was made for another host, is re-issued from the same CA.
The CA's certificate (never its key) goes to training pods as MLSCHED_PROGRESS_CA, and
mlsched.progress verifies the endpoint against it. Keeping the CA in a Secret is what makes it
stable: a CA made afresh at every start would change every pod template, and so restart every
training job, each time the operator restarts.

Why the openssl CLI makes the keys: the Python standard library cannot make keys or sign
certificates, the `cryptography` package is not a dependency (a compiled extension, added for
this alone), and hand-written key generation and signing would be crypto code of our own. The
openssl binary is in the operator image (the Dockerfile installs it explicitly; Debian's
ca-certificates depends on it anyway), and it is what the e2e harness uses for the cluster's own
PKI. It runs only when the Secret is missing or the certificate is due.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import logging
import secrets
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlsched.api import GROUP
from mlsched.controller.kube.kube import KubeApi

log = logging.getLogger("mlsched.controller.tls")
HOST_ANNOTATION = f"{GROUP}/serving-host"  # the host the certificate in the Secret is for
KEYS = ("ca.crt", "ca.key", "tls.crt", "tls.key")
CA_DAYS, CERT_DAYS, RENEW_BEFORE_DAYS = 3650, 365, 30


class TlsError(RuntimeError):
    pass


@dataclass(frozen=True)
class ServingTls:
    cert_file: str
    key_file: str
    ca_pem: str  # published to training pods


def _openssl(*args: str, cwd: Path) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        raise TlsError("--tls-secret needs the openssl command to make a certificate "
                       "(Debian/Ubuntu: apt-get install openssl)")
    done = subprocess.run([binary, *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise TlsError(f"openssl {args[0]} failed: {done.stderr.strip()}")


def _san(host: str) -> str:
    try:
        ipaddress.ip_address(host)
        return f"IP:{host}"
    except ValueError:
        return f"DNS:{host}"


def _new_key_args(key: str) -> list[str]:
    # ECDSA P-256: every TLS client takes it, and it is made in milliseconds (RSA: seconds).
    return ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key]


def make_ca(work: Path) -> None:
    _openssl("req", "-x509", *_new_key_args("ca.key"), "-out", "ca.crt", "-days", str(CA_DAYS),
             "-subj", "/CN=mlsched-operator progress CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=work)


def make_serving_cert(work: Path, host: str) -> None:
    """tls.crt/tls.key for `host`, signed by ca.crt/ca.key in `work`."""
    (work / "serving.ext").write_text(
        f"subjectAltName={_san(host)}\nbasicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n")
    _openssl("req", "-new", *_new_key_args("tls.key"), "-out", "tls.csr",
             "-subj", f"/CN={host}", cwd=work)
    _openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-set_serial", f"0x{secrets.token_hex(16)}", "-days", str(CERT_DAYS),
             "-extfile", "serving.ext", "-out", "tls.crt", cwd=work)


def cert_is_due(work: Path) -> bool:
    """True when tls.crt expires within RENEW_BEFORE_DAYS (or cannot be read)."""
    binary = shutil.which("openssl")
    if binary is None:  # cannot tell, and could not renew: keep serving what is there
        return False
    done = subprocess.run([binary, "x509", "-in", "tls.crt", "-noout", "-checkend",
                           str(RENEW_BEFORE_DAYS * 86400)], cwd=work, capture_output=True)
    return done.returncode != 0


def _read(work: Path) -> dict[str, str]:
    return {k: base64.b64encode((work / k).read_bytes()).decode() for k in KEYS}


def _write(work: Path, data: dict[str, str]) -> None:
    for key in KEYS:
        path = work / key
        path.write_bytes(base64.b64decode(data[key]))
        path.chmod(0o600)


def secret_manifest(namespace: str, name: str, host: str, data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"app.kubernetes.io/part-of": "mlsched"},
                         "annotations": {HOST_ANNOTATION: host}},
            "data": data}


def split_ref(ref: str) -> tuple[str, str]:
    namespace, _, name = ref.partition("/")
    if not namespace or not name or "/" in name:
        raise TlsError(f"--tls-secret must be NAMESPACE/NAME, got {ref!r}")
    return namespace, name


async def ensure_serving_tls(api: KubeApi, ref: str, host: str,
                             work_dir: str | None = None) -> ServingTls:
    """The certificate files to serve with and the CA to publish; makes or renews the Secret."""
    namespace, name = split_ref(ref)
    work = Path(tempfile.mkdtemp(prefix="mlsched-tls-", dir=work_dir))  # mode 0700
    secret = await api.get("Secret", namespace, name)
    if secret is None:
        await asyncio.to_thread(make_ca, work)
        await asyncio.to_thread(make_serving_cert, work, host)
        if await api.create(secret_manifest(namespace, name, host, _read(work))):
            log.info("made a CA and a certificate for %s in Secret %s/%s", host, namespace, name)
        else:  # created meanwhile by another operator: use that one, so pods see one CA
            secret = await api.get("Secret", namespace, name)
    if secret is not None:
        data = secret.get("data") or {}
        missing = [k for k in KEYS if not data.get(k)]
        if missing:
            raise TlsError(f"Secret {namespace}/{name} lacks {', '.join(missing)}: delete it "
                           "and the operator makes a new CA and certificate (training pods "
                           "started since then trust only the new CA)")
        _write(work, data)
        made_for = (secret["metadata"].get("annotations") or {}).get(HOST_ANNOTATION)
        if made_for != host or await asyncio.to_thread(cert_is_due, work):
            # The same CA: pods keep trusting the endpoint, no template changes.
            await asyncio.to_thread(make_serving_cert, work, host)
            await api.patch("Secret", namespace, name, {
                "metadata": {"annotations": {HOST_ANNOTATION: host}}, "data": _read(work)})
            log.info("renewed the certificate for %s in Secret %s/%s", host, namespace, name)
    # The CA key is needed only to issue: it stays in the Secret, not on the operator's disk.
    for leftover in ("tls.csr", "serving.ext", "ca.key"):
        (work / leftover).unlink(missing_ok=True)
    return ServingTls(cert_file=str(work / "tls.crt"), key_file=str(work / "tls.key"),
                      ca_pem=(work / "ca.crt").read_text())
