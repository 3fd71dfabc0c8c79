"""Which published model version a policy serves, and what its status says about versions.

Retraining publishes versions as ConfigMaps (model_versions.py); it never edits the policy. Each
round the operator lists the policy's published versions (ill-formed ones are ignored) and:

- an entry in `spec.models.<phase>.<algorithm>` always wins (pinning an older version's
  ConfigMap there is a rollback);
- otherwise, with `spec.updatePolicy: Auto`, the newest version serves from this round on,
  loaded through the ordinary ConfigMap model path (models.py), so its sha256, card and encoder
  are checked like any model's. A version that does not load is ModelLoaded=False, never a
  crash, and the newest one that does load serves instead (up to FALLBACK_VERSIONS of them,
  then the shipped model, then the phase's heuristic): a broken publication keeps the
  previous good model, not a heuristic. With `Manual` (the default) the newest version is
  only reported as the candidate.

`status.modelVersions["phase/algorithm"]` = {active: {source, sha256, version, configMap,
evaluation}, candidate: {version, sha256, configMap, evaluation}}; `status.modelVersion` sums the
active ones up for the printer column. Pure, except `list_versions`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mlsched.api import ModelRef, SchedulingPolicySpec
from mlsched.formats import model_versions as mv
from mlsched.controller.kube.kube import KubeApi
from mlsched.controller.serving.models import needs_model

log = logging.getLogger("mlsched.controller.serving.version_adoption")
PHASES = ("grouping", "allocation", "placement")
#: How many published versions, newest first, Auto tries before the shipped model: each one
#: that fails costs a ConfigMap read per round.
FALLBACK_VERSIONS = 3


def learned_phases(spec: SchedulingPolicySpec) -> list[tuple[str, str]]:
    """(phase, algorithm) of every phase that serves a model."""
    return [(p, getattr(spec, p)) for p in PHASES if needs_model(p, getattr(spec, p), spec)]


async def list_versions(api: KubeApi, namespace: str, policy: str) -> list[mv.PublishedVersion]:
    """The policy's well-formed published versions (a listing error propagates)."""
    items = await api.list("ConfigMap", namespace, mv.selector(policy))
    out = []
    for cm in items:
        version = mv.parse(cm)
        if version is None or version.policy != policy:
            log.debug("ConfigMap %s/%s is labelled as a model version of %s but is not one; "
                      "ignored", namespace, (cm.get("metadata") or {}).get("name"), policy)
            continue
        out.append(version)
    return out


def adopted(spec: SchedulingPolicySpec,
            versions: Iterable[mv.PublishedVersion]) -> dict[str, dict[str, tuple[ModelRef, ...]]]:
    """phase -> algorithm -> the model references of the versions to try, newest first (Auto
    only, and only where the spec names no model); the first that loads serves."""
    if spec.update_policy != "Auto":
        return {}
    versions = list(versions)
    out: dict[str, dict[str, tuple[ModelRef, ...]]] = {}
    for phase, algorithm in learned_phases(spec):
        if algorithm in spec.models.for_phase(phase):
            continue
        mine = sorted((v for v in versions if (v.phase, v.algorithm) == (phase, algorithm)),
                      key=lambda v: v.version, reverse=True)[:FALLBACK_VERSIONS]
        if mine:
            out.setdefault(phase, {})[algorithm] = tuple(ModelRef.model_validate(v.model_ref) for v in mine)
    return out


def numbers(evaluation: Mapping[str, Any]) -> dict[str, float]:
    """The numeric entries of a version's evaluation (what status can show)."""
    return {str(k): float(v) for k, v in evaluation.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}


@dataclass
class VersionReport:
    status: dict[str, dict[str, Any]]  # status.modelVersions (wire form)
    summary: str | None  # status.modelVersion
    served: dict[str, int | None]  # "phase/algorithm" -> the published version serving it


def report(spec: SchedulingPolicySpec, versions: Iterable[mv.PublishedVersion],
           served_refs: Mapping[str, ModelRef | None],
           active_models: Mapping[str, str]) -> VersionReport:
    """What serves each learned phase (`active_models`: "phase/algorithm" -> sha256 of what
    loaded this round; `served_refs`: the reference it loaded from, None for the shipped
    model) and the newest published version beside it."""
    versions = list(versions)
    by_configmap = {v.configmap: v for v in versions}
    status: dict[str, dict[str, Any]] = {}
    served: dict[str, int | None] = {}
    summary = []
    for phase, algorithm in learned_phases(spec):
        key = f"{phase}/{algorithm}"
        ref = served_refs.get(key)
        source = ("spec" if algorithm in spec.models.for_phase(phase)
                  else "published" if ref is not None else "shipped")
        entry: dict[str, Any] = {}
        digest = active_models.get(key)
        published = None
        if ref is not None and ref.config_map_key_ref is not None:
            published = by_configmap.get(ref.config_map_key_ref.name)
        if published is not None and (published.phase, published.algorithm) != (phase, algorithm):
            published = None
        if digest:
            active: dict[str, Any] = {"source": source, "sha256": digest}
            if ref is not None and ref.config_map_key_ref is not None:
                active["configMap"] = ref.config_map_key_ref.name
            if published is not None and published.sha256 == digest:
                active["version"] = published.version
                active["evaluation"] = numbers(published.evaluation)
            entry["active"] = active
            served[key] = active.get("version")
            summary.append(f"{algorithm} v{active['version']}" if "version" in active
                           else f"{algorithm} {source}")
        newest = mv.newest(versions, phase, algorithm)
        if newest is not None and newest.sha256 != digest:
            entry["candidate"] = {"version": newest.version, "sha256": newest.sha256,
                                  "configMap": newest.configmap,
                                  "evaluation": numbers(newest.evaluation)}
        if entry:
            status[key] = entry
    return VersionReport(status, ", ".join(summary) or None, served)

