"""The retraining dataset as ConfigMaps: closed interval records many to an object (segments),
the open interval on its own.

Status keeps only `historyLimit` intervals; the retraining loop (issue 17) needs every one. The
operator writes each interval of each SchedulingPolicy as a `decision_log.IntervalRecord`
(`to_bytes`: gzip'd JSON) into ConfigMaps of the policy's namespace, which any cluster has, an
Argo CD app does not own (no `app.kubernetes.io/instance`), and `mlsched retrain` reads with
one list call. Closed records go into segments, so a policy costs its namespace a few
ConfigMaps rather than one per interval (issue 55: 55 after 30 minutes in six namespaces,
counted against their ConfigMap quota):

    segment name    <policy>-dataset-<S>             S = 0, 1, 2, ...
            labels  mlsched.io/dataset-of: <policy>  (shortened with a hash past 63 characters)
                    mlsched.io/dataset-segment: "<S>"
                    app.kubernetes.io/managed-by: mlsched-operator
            annotations mlsched.io/policy: <policy>
                    mlsched.io/intervals: "0-17,19"  the intervals held (for metadata-only lists)
            binaryData interval-<N>.json.gz: the closed record of interval N, one key each

A segment is filled up to SEGMENT_BYTES (ConfigMaps hold at most 1 MiB), then the next one
starts. An interval's record, open or too large for a segment, is an object (or parts) of its
own, the format every record had before segments:

    name    <policy>-interval-<N>            part 0
            <policy>-interval-<N>-<k>        part k (a record over PART_BYTES is split)
    labels  mlsched.io/dataset-of: <policy>
            mlsched.io/interval: "<N>"
            mlsched.io/part: "<k>", mlsched.io/parts: "<n>"
            mlsched.io/record-state: open | closed
            app.kubernetes.io/managed-by: mlsched-operator
    annotations mlsched.io/policy: <policy>
                mlsched.io/sha256: <hex of the whole record's bytes>, the same on every part
    binaryData record.json.gz: the record's bytes, or part k of them

A record is `open` from the round that opens its interval (its decisions are safe then) until
the round that closes it moves it, `closed`, into a segment with the jobs and the reward.
Readers take both formats (datasets recorded before segments still train), closed records by
default, and only whole ones: every part present with one sha256 (a record rewritten with more
parts while being read is skipped, not half-read); a segment is one object, read whole.

Pure, except `list_records`, the synchronous helper the retrain CLI calls with a
`kubernetes.client.CoreV1Api`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from mlsched.api import GROUP
from mlsched.policies.decision_log import IntervalRecord

log = logging.getLogger("mlsched.formats.dataset_store")

DATASET_OF = f"{GROUP}/dataset-of"
INTERVAL = f"{GROUP}/interval"
PART = f"{GROUP}/part"
PARTS = f"{GROUP}/parts"
STATE = f"{GROUP}/record-state"
POLICY = f"{GROUP}/policy"
SHA256 = f"{GROUP}/sha256"
SEGMENT = f"{GROUP}/dataset-segment"
INTERVALS = f"{GROUP}/intervals"
MANAGED_BY = "app.kubernetes.io/managed-by"
OPERATOR = "mlsched-operator"
KEY = "record.json.gz"
OPEN, CLOSED = "open", "closed"
#: ConfigMaps hold at most 1 MiB of data; room is left for the metadata.
PART_BYTES = 900 * 1024
#: What a segment's keys and records may add up to (the API server's 1 MiB counts the same).
SEGMENT_BYTES = PART_BYTES
SEGMENT_KEY = re.compile(r"interval-([0-9]{1,9})\.json\.gz")
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


def segment_name(policy: str, number: int) -> str:
    tail = f"-dataset-{number}"
    return shorten(policy, MAX_NAME - len(tail)) + tail


def segment_key(interval: int) -> str:
    return f"interval-{interval}.json.gz"


def ranges(intervals: Iterable[int]) -> str:
    """`0-17,19`: the intervals a segment holds, short enough for an annotation however many."""
    runs: list[list[int]] = []
    for n in sorted(set(intervals)):
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in runs)


def parse_ranges(text: Any) -> set[int] | None:
    """The intervals `ranges` wrote; None if `text` is not such a list."""
    if not isinstance(text, str) or not re.fullmatch(r"([0-9]{1,9}(-[0-9]{1,9})?(,|$))*", text):
        return None
    out: set[int] = set()
    for run in filter(None, text.split(",")):
        a, _, b = run.partition("-")
        if b and int(b) - int(a) > 1_000_000:
            return None  # not ours: no segment holds that many
        out.update(range(int(a), int(b or a) + 1))
    return out


def segment_manifest(namespace: str, policy: str, number: int,
                     records: Mapping[int, bytes]) -> dict[str, Any]:
    """A new segment holding `records` (interval → `IntervalRecord.to_bytes()`)."""
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {
            "name": segment_name(policy, number), "namespace": namespace,
            "labels": {DATASET_OF: policy_label(policy), SEGMENT: str(number), MANAGED_BY: OPERATOR},
            "annotations": {POLICY: policy, INTERVALS: ranges(records)},
        },
        "binaryData": {segment_key(n): base64.b64encode(data).decode("ascii")
                       for n, data in sorted(records.items())},
    }


def segment_bytes(cm: Mapping[str, Any]) -> int:
    """What the API server counts against a ConfigMap's 1 MiB: every key and its (decoded)
    value. Worked out from the base64 text, without decoding it."""
    total = 0
    for key, value in (cm.get("binaryData") or {}).items():
        text = str(value)
        total += len(key) + len(text) * 3 // 4 - text[-2:].count("=")
    for key, value in (cm.get("data") or {}).items():
        total += len(key) + len(str(value).encode())
    return total


def fits(cm: Mapping[str, Any], interval: int, data: bytes, limit: int | None = None) -> bool:
    """Whether interval's record still fits in segment `cm` (or, `cm` empty, in a new one)
    within `limit` bytes (SEGMENT_BYTES)."""
    limit = SEGMENT_BYTES if limit is None else limit
    return segment_bytes(cm) + len(segment_key(interval)) + len(data) <= limit


def is_segment(cm: Mapping[str, Any]) -> bool:
    return _int(((cm.get("metadata") or {}).get("labels") or {}).get(SEGMENT)) is not None


def segment_intervals(cm: Mapping[str, Any]) -> set[int]:
    """The intervals segment `cm` holds, from its keys (nothing decoded)."""
    return {int(m.group(1)) for key in (cm.get("binaryData") or {})
            if (m := SEGMENT_KEY.fullmatch(key))}


def segment_of(cm: Mapping[str, Any], policy: str) -> bool:
    """Whether `cm` is a segment of `policy`'s dataset written by the operator (a ConfigMap
    someone else made under a segment's name is not written to)."""
    meta = cm.get("metadata") or {}
    labels = meta.get("labels") or {}
    return (is_segment(cm) and labels.get(MANAGED_BY) == OPERATOR
            and (meta.get("annotations") or {}).get(POLICY) == policy)


def segment_records(cm: Mapping[str, Any]) -> dict[int, bytes]:
    """interval → the record's bytes, for every key of segment `cm` that is one; others (a key
    someone added, text that is not base64) are logged and skipped."""
    out: dict[int, bytes] = {}
    name = (cm.get("metadata") or {}).get("name")
    for key, value in (cm.get("binaryData") or {}).items():
        match = SEGMENT_KEY.fullmatch(key)
        try:
            if match is None:
                raise ValueError("not interval-<N>.json.gz")
            out[int(match.group(1))] = base64.b64decode(value, validate=True)
        except (TypeError, binascii.Error, ValueError) as err:
            log.warning("dataset segment %s: key %s skipped: %s", name, key, err)
    return out


def _int(text: Any) -> int | None:
    return int(text) if isinstance(text, str) and re.fullmatch(r"[0-9]{1,9}", text) else None


def assemble(configmaps: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, int], tuple[str, bytes]]:
    """(namespace, policy, interval) → (state, the record's bytes), for every record in a
    segment and every record of its own whose parts are all here and agree; ill-formed
    ConfigMaps are ignored. A record in a segment wins over one of its own (a restart between
    moving an open record into its segment and deleting it leaves both)."""
    groups: dict[tuple[str, str, int, str], dict[int, Mapping[str, Any]]] = defaultdict(dict)
    segments: list[tuple[int, Mapping[str, Any]]] = []
    for cm in configmaps:
        meta = cm.get("metadata") or {}
        labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
        number = _int(labels.get(SEGMENT))
        if number is not None:
            if notes.get(POLICY):
                segments.append((number, cm))
            continue
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
    for _, cm in sorted(segments, key=lambda s: s[0]):  # the newer segment last (wins)
        meta = cm["metadata"]
        for interval, data in segment_records(cm).items():
            out[(meta.get("namespace", ""), meta["annotations"][POLICY], interval)] = (CLOSED, data)
    return out


def read_records(configmaps: list[dict], include_open: bool = False) -> list[IntervalRecord]:
    """The interval records in listed ConfigMap bodies (dict form, e.g. from `list_records`
    or `kubectl get cm -l mlsched.io/dataset-of=P -o json`), both formats, sorted by policy and
    interval. Only closed ones unless `include_open`; records this mlsched cannot read (another
    format version, bytes that are not a record, one stored under another interval's name) are
    logged and skipped."""
    records = []
    for (_, policy, interval), (state, data) in sorted(assemble(configmaps).items()):
        if state != CLOSED and not include_open:
            continue
        try:
            record = IntervalRecord.from_bytes(data)
            if (record.policy, record.interval) != (policy, interval):
                raise ValueError(f"it is interval {record.interval} of policy {record.policy!r}")
        except Exception as err:  # noqa: BLE001 - bad bytes (zlib.error too) skip one record
            log.warning("dataset record %s #%d skipped: %s", policy, interval, err)
            continue
        records.append(record)
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
    """interval → names of the ConfigMaps of its own (from a metadata-only list), for
    retention; segments are `stored_segments`."""
    out: dict[int, list[str]] = defaultdict(list)
    for cm in configmaps:
        meta = cm.get("metadata") or {}
        interval = _int((meta.get("labels") or {}).get(INTERVAL))
        if interval is not None and meta.get("name"):
            out[interval].append(meta["name"])
    return dict(out)


def stored_segments(configmaps: Iterable[Mapping[str, Any]]) -> dict[int, tuple[str, set[int]]]:
    """segment number → (its name, the intervals its annotation says it holds), from a
    metadata-only list. An annotation that is not a list of intervals counts as none (logged):
    the next write to that segment reads its keys and writes the annotation again."""
    out: dict[int, tuple[str, set[int]]] = {}
    for cm in configmaps:
        meta = cm.get("metadata") or {}
        number = _int((meta.get("labels") or {}).get(SEGMENT))
        if number is None or not meta.get("name"):
            continue
        held = parse_ranges((meta.get("annotations") or {}).get(INTERVALS))
        if held is None:
            log.warning("dataset segment %s: annotation %s is not a list of intervals",
                        meta["name"], INTERVALS)
        out[number] = (meta["name"], held or set())
    return out


def expired(intervals: Iterable[int], limit: int) -> list[int]:
    """The intervals beyond the newest `limit`, oldest first."""
    ordered = sorted(set(intervals))
    return ordered[:max(0, len(ordered) - limit)]
