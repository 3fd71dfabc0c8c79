"""Publishing a candidate as a model version, once, and what a run may consume.

A store is where the published-version ConfigMaps (mlsched.formats.model_versions) live:
the cluster (`KubeStore`: list and create ConfigMaps, never update one) or a directory of
ConfigMap JSON files (`DirStore`: tests, benchmarks, a dry run's --store). Retraining never
writes a SchedulingPolicy.

A model too large for one ConfigMap is published as part ConfigMaps, created first and named
by their content, then the version's ConfigMap naming them (model_versions). A part already
there (a rerun, or a run that lost a race for the version number) is reused when it holds the
same bytes, and refused, with what to delete, when it does not.

Idempotence: a candidate whose bytes a version already holds is not published again (a Job
killed after creating its ConfigMap and rerun trains the same bytes from the same seed, or
finds nothing new, see below). Consume-once: every version's evaluation annotation names the
last interval it was trained through; a run trains only on intervals after the newest such
interval of its policy and algorithm.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from mlsched.formats import model_sources, model_versions
from mlsched.formats.dataset_store import policy_label
from mlsched.formats.model_versions import PublishedVersion


class Store(Protocol):
    def versions(self) -> list[PublishedVersion]: ...

    def configmaps(self) -> list[dict]: ...

    def read(self, name: str) -> dict | None:
        """The ConfigMap `name` (any, not only a version), None when there is none."""

    def create(self, manifest: dict) -> None:
        """Create the ConfigMap; raise FileExistsError if its name is taken."""


class DirStore:
    def __init__(self, directory: str | Path, policy: str):
        self.dir, self.policy = Path(directory), policy

    def configmaps(self) -> list[dict]:
        if not self.dir.is_dir():
            return []
        docs = [json.loads(p.read_text()) for p in sorted(self.dir.glob("*.configmap.json"))]
        return [d for d in docs if (d.get("metadata", {}).get("labels") or {}).get(model_versions.MODEL_OF) == policy_label(self.policy)]

    def versions(self) -> list[PublishedVersion]:
        return [v for v in map(model_versions.parse, self.configmaps()) if v is not None]

    def read(self, name: str) -> dict | None:
        path = self.dir / f"{name}.configmap.json"
        return json.loads(path.read_text()) if path.is_file() else None

    def create(self, manifest: dict) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"{manifest['metadata']['name']}.configmap.json"
        try:
            with path.open("x") as f:  # exclusive: a name is created once, as the API server does
                json.dump(manifest, f, indent=1, sort_keys=True)
        except FileExistsError:
            raise FileExistsError(f"ConfigMap {manifest['metadata']['name']} exists") from None


def model_bytes(store: Store, configmap: dict, algorithm: str,
                limit: int = model_sources.DEFAULT_MAX_MODEL_BYTES) -> tuple[bytes, str]:
    """(ONNX bytes, card JSON) of a published version's ConfigMap, its parts joined and checked
    as the operator does (model_sources.ModelLoadError when they do not join)."""
    key, name = model_versions.model_key(algorithm), configmap["metadata"]["name"]
    split = model_sources.named_parts(configmap, key, f"ConfigMap {name}")
    if split is None:
        onnx = base64.b64decode(configmap["binaryData"][key])
    else:
        names, digest = split
        onnx = model_sources.join_parts(((n, store.read(n)) for n in names), len(names), key, digest,
                                        f"ConfigMap {name} key {key}", configmap["metadata"].get("namespace", ""),
                                        limit)
    return onnx, configmap["data"][model_versions.card_key(algorithm)]


def _create_part(store: Store, part: Mapping) -> None:
    """Create a part ConfigMap, or reuse the one of its name if it holds the same bytes."""
    name = part["metadata"]["name"]
    try:
        store.create(dict(part))
    except FileExistsError:
        there = store.read(name) or {}
        if (there.get("binaryData") or {}) != part["binaryData"]:
            raise RuntimeError(f"could not publish: ConfigMap {name} exists and does not hold this model's "
                               "part of that name; delete it and run again") from None


def trained_through(versions: list[PublishedVersion], phase: str, algorithm: str) -> int | None:
    """The last interval any published version of this phase/algorithm was trained through."""
    marks = [v.evaluation.get("trained_through_interval") for v in versions
             if (v.phase, v.algorithm) == (phase, algorithm)]
    marks = [int(m) for m in marks if isinstance(m, int)]
    return max(marks) if marks else None


def unconsumed(records: list, versions: list[PublishedVersion], phase: str, algorithm: str) -> list:
    mark = trained_through(versions, phase, algorithm)
    return [r for r in records if mark is None or r.interval > mark]


def publish(store: Store, namespace: str, policy: str, phase: str, algorithm: str, onnx: bytes,
            card_json: str, evaluation: dict) -> tuple[PublishedVersion | None, bool]:
    """(the version holding these bytes, whether this call created it)."""
    parts = model_versions.part_manifests(namespace, policy, algorithm, onnx, card_json)
    for _attempt in range(3):
        versions = store.versions()
        same = model_versions.already_published(versions, phase, algorithm, onnx)
        if same is not None:
            return same, False
        version = model_versions.next_version(versions, phase, algorithm)
        manifest = model_versions.manifest(namespace, policy, phase, algorithm, version, onnx, card_json, evaluation,
                                           parts)
        for part in parts:  # before the version: it marks the model published, whole
            _create_part(store, part)
        try:
            store.create(manifest)
        except FileExistsError:
            continue  # another run took this version number first: look again
        return model_versions.parse(manifest), True
    raise RuntimeError("could not publish: the version numbers kept being taken by another run")
