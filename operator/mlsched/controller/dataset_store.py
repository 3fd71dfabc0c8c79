"""The retraining dataset as ConfigMaps: one interval record per closed interval per policy.

Status keeps only `historyLimit` intervals; the retraining loop (issue 17) needs every one. The
operator writes each interval of each SchedulingPolicy as a `decision_log.IntervalRecord`
(`to_bytes`: gzip'd JSON) into ConfigMaps of the policy's namespace, which any cluster has, an
Argo CD app does not own (no `app.kubernetes.io/instance`), and `mlsched retrain` reads with
one list call:

    name    <policy>-interval-<N>            part 0
            <policy>-interval-<N>-<k>        part k (a record over PART_BYTES is split)
    labels  mlsched.io/dataset-of: <policy>  (shortened with a hash past 63 characters)
            mlsched.io/interval: "<N>"
            mlsched.io/part: "<k>", mlsched.io/parts: "<n>"
            mlsched.io/record-state: open | closed
            app.kubernetes.io/managed-by: mlsched-operator
    annotations mlsched.io/policy: <policy>
                mlsched.io/sha256: <hex of the whole record's bytes>, the same on every part
    binaryData record.json.gz: the record's bytes, or part k of them

A record is `open` from the round that opens its interval (its decisions are safe then) until
the round that closes it writes it again, `closed`, with the jobs and the reward. Readers take
closed records by default, and only whole ones: every part present with one sha256 (a record
rewritten with more parts while being read is skipped, not half-read).

Pure, except `list_records`, the synchronous helper the retrain CLI calls with a
`kubernetes.client.CoreV1Api`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from mlsched.api import GROUP
from mlsched.policies.decision_log import IntervalRecord

DATASET_OF = f"{GROUP}/dataset-of"
INTERVAL = f"{GROUP}/interval"
PART = f"{GROUP}/part"
PARTS = f"{GROUP}/parts"
STATE = f"{GROUP}/record-state"
POLICY = f"{GROUP}/policy"
SHA256 = f"{GROUP}/sha256"
MANAGED_BY = "app.kubernetes.io/managed-by"
OPERATOR = "mlsched-operator"
KEY = "record.json.gz"
OPEN, CLOSED = "open", "closed"
#: ConfigMaps hold at most 1 MiB of data; room is left for the metadata.
PART_BYTES = 900 * 1024
MAX_NAME, MAX_LABEL = 253, 63


def shorten(text: str, room: int) -> str:
    """`text` if it fits in `room` characters, else a prefix and a hash of the whole: two long
    names that share a prefix still differ."""
    if len(text) <= room:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    return f"{text[:room - 11].rstrip('-.')}-{digest}"


def policy_label(policy: str) -> str:
    """The `dataset-of` label value of a policy (label values stop at 63 characters)."""
    return shorten(policy, MAX_LABEL)


def selector(policy: str, interval: int | None = None) -> str:
    """Label selector for a policy's records (or one interval's parts)."""
    parts = [f"{DATASET_OF}={policy_label(policy)}", f"{MANAGED_BY}={OPERATOR}"]
    if interval is not None:
        parts.append(f"{INTERVAL}={interval}")
    return ",".join(parts)


def configmap_name(policy: str, interval: int, part: int = 0) -> str:
    tail = f"-interval-{interval}" + (f"-{part}" if part else "")
    return shorten(policy, MAX_NAME - len(tail)) + tail


def split(data: bytes, size: int = PART_BYTES) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)] or [b""]


def manifests(record: IntervalRecord, state: str, size: int = PART_BYTES) -> list[dict[str, Any]]:
    """The ConfigMaps holding `record` (part 0 first)."""
    data = record.to_bytes()
    digest = hashlib.sha256(data).hexdigest()
    chunks = split(data, size)
    return [{
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {
            "name": configmap_name(record.policy, record.interval, k),
            "namespace": record.namespace,
            "labels": {DATASET_OF: policy_label(record.policy), INTERVAL: str(record.interval),
                       PART: str(k), PARTS: str(len(chunks)), STATE: state,
                       MANAGED_BY: OPERATOR},
            "annotations": {POLICY: record.policy, SHA256: digest},
        },
        "binaryData": {KEY: base64.b64encode(chunk).decode("ascii")},
    } for k, chunk in enumerate(chunks)]


def _int(text: Any) -> int | None:
    return int(text) if isinstance(text, str) and re.fullmatch(r"[0-9]{1,9}", text) else None


def assemble(configmaps: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, int], tuple[str, bytes]]:
    """(namespace, policy, interval) → (state, the record's bytes), for every record whose
    parts are all here and agree; ill-formed ConfigMaps are ignored."""
    groups: dict[tuple[str, str, int, str], dict[int, Mapping[str, Any]]] = defaultdict(dict)
    for cm in configmaps:
        meta = cm.get("metadata") or {}
        labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
        interval, part = _int(labels.get(INTERVAL)), _int(labels.get(PART))
        policy, digest = notes.get(POLICY), notes.get(SHA256)
        if interval is None or part is None or not policy or not digest:
            continue
        groups[(meta.get("namespace", ""), policy, interval, digest)][part] = cm
    out: dict[tuple[str, str, int], tuple[str, bytes]] = {}
    for (namespace, policy, interval, digest), parts in groups.items():
        count = _int((parts.get(0, {}).get("metadata") or {}).get("labels", {}).get(PARTS))
        if not count or set(parts) != set(range(count)):
            continue  # a part missing, or parts of two writes
        try:
            data = b"".join(base64.b64decode((parts[k].get("binaryData") or {})[KEY], validate=True)
                            for k in range(count))
        except (KeyError, TypeError, binascii.Error, ValueError):
            continue
        if hashlib.sha256(data).hexdigest() != digest:
            continue
        state = parts[0]["metadata"]["labels"].get(STATE, CLOSED)
        key = (namespace, policy, interval)
        if key not in out or state == CLOSED:  # a closed write wins over a stale open one
            out[key] = (state, data)
    return out


def read_records(configmaps: list[dict], include_open: bool = False) -> list[IntervalRecord]:
    """The interval records in listed ConfigMap bodies (dict form, e.g. from `list_records`
    or `kubectl get cm -l mlsched.io/dataset-of=P -o json`), sorted by policy and interval.
    Only closed ones unless `include_open`; records this mlsched cannot read are skipped."""
    records = []
    for (_, _, _), (state, data) in sorted(assemble(configmaps).items()):
        if state != CLOSED and not include_open:
            continue
        try:
            records.append(IntervalRecord.from_bytes(data))
        except (ValueError, TypeError, KeyError):
            continue
    return sorted(records, key=lambda r: (r.namespace, r.policy, r.interval))


def list_records(core_v1_api, namespace: str, policy: str,
                 include_open: bool = False) -> list[IntervalRecord]:
    """Every closed interval record of a policy, oldest first: one paged list call with the
    `kubernetes` client's CoreV1Api (the retrain CLI's; it needs `list` on configmaps)."""
    items: list[dict] = []
    token = None
    while True:
        response = core_v1_api.list_namespaced_config_map(
            namespace, label_selector=selector(policy), limit=100, _continue=token,
            _preload_content=False)
        page = json.loads(response.data)
        items += page.get("items") or []
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            break
    mine = [cm for cm in items
            if ((cm.get("metadata") or {}).get("annotations") or {}).get(POLICY) == policy]
    return read_records(mine, include_open)


def stored_intervals(configmaps: Iterable[Mapping[str, Any]]) -> dict[int, list[str]]:
    """interval → names of its ConfigMaps (from a metadata-only list), for retention."""
    out: dict[int, list[str]] = defaultdict(list)
    for cm in configmaps:
        meta = cm.get("metadata") or {}
        interval = _int((meta.get("labels") or {}).get(INTERVAL))
        if interval is not None and meta.get("name"):
            out[interval].append(meta["name"])
    return dict(out)


def expired(intervals: Iterable[int], limit: int) -> list[int]:
    """The intervals beyond the newest `limit`, oldest first."""
    ordered = sorted(set(intervals))
    return ordered[:max(0, len(ordered) - limit)]
