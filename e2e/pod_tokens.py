"""ServiceAccount tokens bound to a pod, minted the way a kubelet mints them.

kwok pods run no containers, so nobody fills the projected token volume the
operator puts into every training pod. The e2e tier stands in for the kubelet:
a TokenRequest for the pod's ServiceAccount with the audience and lifetime of
that volume, bound to the pod (name and uid). The apiserver then puts the pod
into the token's claims, which is what lets the operator tell which pod (and so
which job) a report comes from.
"""

from __future__ import annotations

from pathlib import Path

from kubernetes import client

#: The audience the operator's progress endpoint accepts (mlsched.controller.kube.constants).
PROGRESS_AUDIENCE = "mlsched.io/progress"


def projected_token_audience(pod: client.V1Pod) -> str | None:
    """The audience of the pod's projected ServiceAccount token volume, if it has one."""
    for volume in pod.spec.volumes or ():
        for source in (volume.projected.sources if volume.projected else None) or ():
            if source.service_account_token and source.service_account_token.audience:
                return source.service_account_token.audience
    return None


def request_token(core: client.CoreV1Api, pod: client.V1Pod, audience: str | None,
                  expiration_seconds: int = 3600) -> str:
    """A token of the pod's ServiceAccount, bound to the pod. audience=None: the
    apiserver's own audience (a token a pod would use against the API)."""
    spec: dict = {"expirationSeconds": expiration_seconds,
                  "boundObjectRef": {"apiVersion": "v1", "kind": "Pod",
                                     "name": pod.metadata.name, "uid": pod.metadata.uid}}
    if audience:
        spec["audiences"] = [audience]
    answer = core.create_namespaced_service_account_token(
        pod.spec.service_account_name or "default", pod.metadata.namespace,
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})
    return answer.status.token


class TokenFiles:
    """One token file per pod, as the kubelet would mount it, reused while the pod lives."""

    def __init__(self, core: client.CoreV1Api, directory: Path):
        self.core = core
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._paths: dict[str, Path] = {}  # pod uid -> token file

    def path_for(self, pod: client.V1Pod) -> Path:
        uid = pod.metadata.uid
        path = self._paths.get(uid)
        if path is None:
            audience = projected_token_audience(pod) or PROGRESS_AUDIENCE
            path = self.directory / f"{pod.metadata.name}-{uid}.token"
            path.write_text(request_token(self.core, pod, audience))
            path.chmod(0o600)
            self._paths[uid] = path
        return path

    def forget_except(self, live_uids: set[str]) -> None:
        for uid in set(self._paths) - live_uids:
            self._paths.pop(uid).unlink(missing_ok=True)


def client_with_token(control_plane, token: str) -> client.ApiClient:
    configuration = client.Configuration()
    configuration.host = control_plane.apiserver_url
    configuration.ssl_ca_cert = str(control_plane.ca_cert_path)
    configuration.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(configuration)
