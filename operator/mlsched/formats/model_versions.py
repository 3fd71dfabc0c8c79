"""Published model versions: the ConfigMaps retraining writes and the operator adopts (issue 17).

A retraining Job never edits a SchedulingPolicy (Argo CD owns its spec); it publishes a
candidate as a new ConfigMap in the policy's namespace, and the policy's `updatePolicy` says
whether the operator adopts it (Auto) or only reports it (Manual). One ConfigMap per version:

    name    <policy>-<algorithm>-v<version>          (version 1, 2, ...; shortened with a hash
                                                      when the policy's name is long)
    labels  mlsched.io/model-of: <policy>          (shortened with a hash past 63 characters,
                                                      the full name in annotation mlsched.io/policy)
            mlsched.io/phase: allocation | placement | grouping
            mlsched.io/algorithm: dl2 | chic | ...
            mlsched.io/model-version: "<version>"
    binaryData <algorithm>.onnx                      the graph
    data       <algorithm>.card.json                 its model card (the key beside the graph,
                                                      which is where the operator's ConfigMap
                                                      model reader looks for it)
    annotations mlsched.io/sha256: <hex of the graph>
                mlsched.io/evaluation: JSON          how it was judged (retrain.py writes it)

A model too large for one ConfigMap (ConfigMaps hold 1 MiB; the paper-size Harmony Transformer
is 1.4 MB) is split over part ConfigMaps, the store every cluster has (a PersistentVolume needs a
StorageClass, a registry an image pull path into the operator). Parts are created first, so the
version's ConfigMap still marks a publication by existing (consume-once holds), and named by
their content, so a rerun or a race for a version number reuses them:

    name    <policy>-<algorithm>-<sha256[:16]>-part-<k>      k = 1, 2, ...
    labels  mlsched.io/model-part-of: <policy>, mlsched.io/algorithm
    binaryData <algorithm>.onnx                      piece k of the graph
    annotations mlsched.io/sha256: <hex of the whole graph>

and the version's ConfigMap holds no `<algorithm>.onnx` but names them in order, with the
whole's digest, in annotation mlsched.io/model-parts (model_sources.MODEL_PARTS, the
convention the operator's ConfigMap model reader joins for any ConfigMap). Parts are not owned
by their version (the retraining Role may not patch): deleting a version leaves them, named in
its annotation and listed by `kubectl get cm -l mlsched.io/model-part-of=<policy>`.

Because the keys follow the ConfigMap model convention, a version is also an ordinary
`models.<phase>.<algorithm>.configMapKeyRef`: pinning one (a rollback) is one edit of the spec.
Pure: building and parsing manifests; the operator and `mlsched retrain` do their own I/O.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mlsched.api import GROUP
from mlsched.formats.dataset_store import PART_BYTES, POLICY, policy_label, shorten
from mlsched.formats.model_sources import (  # MODEL_PARTS: the annotation of this format, re-exported
    MODEL_PARTS, ModelLoadError, model_pieces, named_parts, parts_annotation,  # noqa: F401
)

MODEL_OF = f"{GROUP}/model-of"
PHASE = f"{GROUP}/phase"
ALGORITHM = f"{GROUP}/algorithm"
VERSION = f"{GROUP}/model-version"
SHA256 = f"{GROUP}/sha256"
EVALUATION = f"{GROUP}/evaluation"
PART_OF = f"{GROUP}/model-part-of"
MANAGED_BY = "app.kubernetes.io/managed-by"
RETRAIN = "mlsched-retrain"
MAX_NAME = 253


def configmap_name(policy: str, algorithm: str, version: int) -> str:
    name = f"{policy}-{algorithm}-v{version}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(policy.encode()).hexdigest()[:10]
    keep = MAX_NAME - len(f"-{digest}-{algorithm}-v{version}")
    return f"{policy[:keep].rstrip('-.')}-{digest}-{algorithm}-v{version}"


def part_name(policy: str, algorithm: str, digest: str, part: int) -> str:
    tail = f"-{algorithm}-{digest[:16]}-part-{part}"
    return shorten(policy, MAX_NAME - len(tail)) + tail


def selector(policy: str, phase: str | None = None, algorithm: str | None = None) -> str:
    """Label selector for a policy's published versions (optionally one phase/algorithm)."""
    parts = [f"{MODEL_OF}={policy_label(policy)}"]
    if phase:
        parts.append(f"{PHASE}={phase}")
    if algorithm:
        parts.append(f"{ALGORITHM}={algorithm}")
    return ",".join(parts)


def model_key(algorithm: str) -> str:
    return f"{algorithm}.onnx"


def card_key(algorithm: str) -> str:
    return f"{algorithm}.card.json"


@dataclass(frozen=True)
class PublishedVersion:
    policy: str
    phase: str
    algorithm: str
    version: int
    configmap: str
    sha256: str
    evaluation: dict[str, Any]

    @property
    def model_ref(self) -> dict[str, Any]:
        """The spec entry that pins this version (`models.<phase>.<algorithm>`)."""
        return {"configMapKeyRef": {"name": self.configmap, "key": model_key(self.algorithm)},
                "sha256": self.sha256}


def part_manifests(namespace: str, policy: str, algorithm: str, onnx: bytes, card_json: str,
                   part_bytes: int = PART_BYTES) -> list[dict[str, Any]]:
    """The part ConfigMaps of a model too large to publish in one (none when it fits), to be
    created before the version's (`manifest(..., parts=...)`)."""
    digest = hashlib.sha256(onnx).hexdigest()
    return [{
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {
            "name": part_name(policy, algorithm, digest, k), "namespace": namespace,
            "labels": {PART_OF: policy_label(policy), ALGORITHM: algorithm, MANAGED_BY: RETRAIN},
            "annotations": {POLICY: policy, SHA256: digest},
        },
        "binaryData": {model_key(algorithm): base64.b64encode(chunk).decode("ascii")},
    } for k, chunk in enumerate(model_pieces(onnx, card_json.encode(), part_bytes), 1)]


def manifest(namespace: str, policy: str, phase: str, algorithm: str, version: int,
             onnx: bytes, card_json: str, evaluation: Mapping[str, Any],
             parts: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The version's ConfigMap: the graph itself, or the names of its `parts` (part_manifests)."""
    digest = hashlib.sha256(onnx).hexdigest()
    annotations = {POLICY: policy, SHA256: digest, EVALUATION: json.dumps(dict(evaluation), sort_keys=True)}
    body: dict[str, Any] = {}
    if parts:
        annotations.update(parts_annotation(model_key(algorithm), onnx, [p["metadata"]["name"] for p in parts]))
    else:
        body["binaryData"] = {model_key(algorithm): base64.b64encode(onnx).decode("ascii")}
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {
            "name": configmap_name(policy, algorithm, version), "namespace": namespace,
            "labels": {MODEL_OF: policy_label(policy), PHASE: phase, ALGORITHM: algorithm, VERSION: str(version),
                       MANAGED_BY: RETRAIN},
            "annotations": annotations,
        },
        **body,
        "data": {card_key(algorithm): card_json},
    }


_VERSION_TEXT = re.compile(r"^[1-9][0-9]{0,8}$")


def parse(configmap: Mapping[str, Any]) -> PublishedVersion | None:
    """A published version from a ConfigMap body (dict form), or None if it is not a well-formed
    one (a tenant can label any ConfigMap: such a one is ignored, never adopted)."""
    meta = configmap.get("metadata") or {}
    labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
    version_text = str(labels.get(VERSION, ""))
    algorithm = labels.get(ALGORITHM)
    if not (labels.get(MODEL_OF) and labels.get(PHASE) and algorithm
            and _VERSION_TEXT.match(version_text)):
        return None
    if not re.fullmatch(r"[0-9a-f]{64}", str(notes.get(SHA256, ""))):
        return None
    if model_key(algorithm) not in (configmap.get("binaryData") or {}) and not _split(configmap, algorithm):
        return None
    try:
        evaluation = json.loads(notes.get(EVALUATION) or "{}")
    except ValueError:
        evaluation = {}
    return PublishedVersion(notes.get(POLICY) or labels[MODEL_OF], labels[PHASE], algorithm, int(version_text),
                            meta.get("name", ""), notes[SHA256],
                            evaluation if isinstance(evaluation, dict) else {})


def _split(configmap: Mapping[str, Any], algorithm: str) -> bool:
    try:
        return named_parts(configmap, model_key(algorithm), "") is not None
    except ModelLoadError:
        return False


def newest(versions: Iterable[PublishedVersion], phase: str, algorithm: str) -> PublishedVersion | None:
    mine = [v for v in versions if (v.phase, v.algorithm) == (phase, algorithm)]
    return max(mine, key=lambda v: v.version, default=None)


def next_version(versions: Iterable[PublishedVersion], phase: str, algorithm: str) -> int:
    top = newest(versions, phase, algorithm)
    return 1 if top is None else top.version + 1


def already_published(versions: Iterable[PublishedVersion], phase: str, algorithm: str,
                      onnx: bytes) -> PublishedVersion | None:
    """The version holding exactly these bytes, if any: a rerun Job publishes nothing twice."""
    digest = hashlib.sha256(onnx).hexdigest()
    return next((v for v in versions if (v.phase, v.algorithm, v.sha256) == (phase, algorithm, digest)),
                None)
