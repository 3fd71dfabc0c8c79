"""HTTPS for the progress endpoint (--tls-secret): the Secret is made once and reused, the
certificate is renewed from the same CA, pods get the CA and the client verifies with it.
Real openssl and real TLS on loopback; the API is MemoryKube."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from dataclasses import replace

import pytest

from mlsched import progress as client
from mlsched.controller.progress import progress_server
from mlsched.controller.serving import serving_tls
from mlsched.controller.process.config import OperatorConfig
from mlsched.controller.objects.desired import pod_template
from builders import NS, make_runtime
from builders import progress_report as report, progress_world as world

REF = "mlsched-system/mlsched-operator-tls"


def secret(kube):
    return kube.obj("Secret", "mlsched-system", "mlsched-operator-tls")


def test_the_secret_is_made_once_and_its_ca_stays():
    _, kube = make_runtime()
    first = asyncio.run(serving_tls.ensure_serving_tls(kube, REF, "op.mlsched-system.svc"))
    stored = secret(kube)
    assert stored["type"] == "kubernetes.io/tls" and set(stored["data"]) == set(serving_tls.KEYS)
    assert base64.b64decode(stored["data"]["ca.crt"]).decode() == first.ca_pem
    assert "PRIVATE KEY" not in first.ca_pem
    again = asyncio.run(serving_tls.ensure_serving_tls(kube, REF, "op.mlsched-system.svc"))
    assert again.ca_pem == first.ca_pem and secret(kube) == stored  # a restart changes nothing
    # Another host (the URL changed): a new certificate from the same CA.
    moved = asyncio.run(serving_tls.ensure_serving_tls(kube, REF, "127.0.0.1"))
    assert moved.ca_pem == first.ca_pem
    assert secret(kube)["data"]["tls.crt"] != stored["data"]["tls.crt"]
    assert secret(kube)["metadata"]["annotations"][serving_tls.HOST_ANNOTATION] == "127.0.0.1"
    text = subprocess.run(["openssl", "x509", "-in", moved.cert_file, "-noout", "-text"],
                          capture_output=True, text=True, check=True).stdout
    assert "IP Address:127.0.0.1" in text and "TLS Web Server Authentication" in text


def test_a_secret_without_the_ca_is_an_error_that_says_what_to_do():
    _, kube = make_runtime()
    kube.put(serving_tls.secret_manifest("mlsched-system", "mlsched-operator-tls", "h",
                                         {"tls.crt": "eA==", "tls.key": "eA=="}))
    with pytest.raises(serving_tls.TlsError, match="lacks ca.crt, ca.key: delete it"):
        asyncio.run(serving_tls.ensure_serving_tls(kube, REF, "h"))
    with pytest.raises(serving_tls.TlsError, match="NAMESPACE/NAME"):
        asyncio.run(serving_tls.ensure_serving_tls(kube, "no-namespace", "h"))


def test_settings_that_cannot_work_together_are_refused():
    https = "https://op:8080/v1/progress"
    assert OperatorConfig().problems() == []
    assert OperatorConfig(progress_url=https, tls_secret=REF).problems() == []
    assert "make --progress-url https://" in OperatorConfig(tls_secret=REF).problems()[0]
    assert "add --tls-secret" in OperatorConfig(progress_url=https).problems()[0]
    assert OperatorConfig(progress_url=https, tls_cert="c").problems()
    from mlsched.controller.__main__ import main
    assert main(["--tls-secret", REF, "--progress-url", "http://op/v1/progress"]) == 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_https_endpoint_pods_get_the_ca_and_plain_http_is_refused(tmp_path, monkeypatch):
    rt, kube = world()
    port = free_port()
    url = f"https://127.0.0.1:{port}/v1/progress"
    monkeypatch.setattr(rt.process, "config", OperatorConfig(port=port, progress_url=url, tls_secret=REF))
    rt.pod_settings = replace(rt.pod_settings, progress_url=url)  # as Runtime builds it from config
    token = tmp_path / "token"
    token.write_text("bert-token")
    out = {}

    async def serve():
        runner = await progress_server.start(rt)
        try:
            job = rt.cluster.indexes.job(NS, "bert")
            tpl = pod_template(job, "worker", {"ps": 1, "worker": 1}, rt.pod_settings)
            env = {e["name"]: e["value"] for e in tpl["spec"]["containers"][0]["env"] if "value" in e}
            env.update(MLSCHED_NAMESPACE=NS, MLSCHED_TOKEN_FILE=str(token))
            out["env"] = env
            # As the training pod reports: URL and CA from its environment.
            out["ok"] = await asyncio.to_thread(client.Reporter.from_env(env).report, 5)
            # A client that does not know the CA refuses the endpoint.
            out["unverified"] = await asyncio.to_thread(
                client.Reporter(url=url, namespace=NS, job="bert", token_file=str(token)).report, 6)

            def plain_http():
                request = urllib.request.Request(url.replace("https", "http"), method="POST",
                                                 data=json.dumps(report()).encode())
                try:
                    urllib.request.urlopen(request, timeout=5)
                    return "answered"
                except urllib.error.HTTPError as err:
                    return err.code
                except OSError as err:
                    return type(err).__name__

            out["plain"] = await asyncio.to_thread(plain_http)
        finally:
            await runner.cleanup()

    asyncio.run(serve())
    assert out["env"]["MLSCHED_PROGRESS_URL"] == url
    assert out["env"]["MLSCHED_PROGRESS_CA"].startswith("-----BEGIN CERTIFICATE-----")
    assert out["ok"] is True and out["unverified"] is False
    assert out["plain"] not in ("answered", 200)
    assert kube.obj("MLJob", NS, "bert")["status"]["progress"]["epochsDone"] == 5.0
    assert isinstance(client.Reporter.from_env(out["env"]).ssl_context(), ssl.SSLContext)
