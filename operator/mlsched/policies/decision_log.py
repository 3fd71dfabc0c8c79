"""The decision log: every inference a learned policy made, and what the interval it opened earned.

The retraining loop (issue 17) needs transitions it can rebuild exactly: the encoded state the
network saw, the actions it was allowed, the action taken and the probability with which the
serving policy (exploration included) took it, and the reward that followed. Status history
holds only counts and rewards, so learned phases record their steps here as they decide.

Two types, both pure data (no Kubernetes, no torch) so that the operator writes them, the
simulator can produce them, and `mlsched retrain` reads them:

- `RoundDecisions`: the steps of one learned phase in one round (or admission step), as arrays.
  `DecisionRecorder` collects them; an actor calls `record(...)` once per inference. `kept`
  names the jobs the cycle guard (cycle_guard.py) kept at their counts where the phase's
  decision would have sent them back to counts they held a round or a few before.
- `IntervalRecord`: one closed interval of one SchedulingPolicy, the unit of the dataset: the
  decisions made when it opened (the round and any admission steps until it closed), each job's
  grant and what it trained, and the policy's reward. `to_bytes` / `from_bytes` give a
  self-describing gzip'd JSON document (arrays as base64 of little-endian bytes, states as
  float16) with a format version; a reader refuses a version it does not know.
"""

from __future__ import annotations

import base64
import gzip
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

FORMAT = "mlsched.io/interval-record"
FORMAT_VERSION = 3  # 2: RoundDecisions.kept (written when not empty); 3: JobInterval's bounds
READS = (1, 2, 3)  # a version-1 record is a version-2 one with nothing kept; 2 has no bounds


def _pack(array: np.ndarray, dtype: str) -> dict[str, Any]:
    data = np.ascontiguousarray(array, dtype=np.dtype(dtype).newbyteorder("<"))
    return {"dtype": dtype, "shape": list(data.shape),
            "data": base64.b64encode(data.tobytes()).decode("ascii")}


def _unpack(raw: dict[str, Any]) -> np.ndarray:
    dtype = np.dtype(raw["dtype"]).newbyteorder("<")
    flat = np.frombuffer(base64.b64decode(raw["data"]), dtype=dtype)
    return flat.reshape(raw["shape"]).astype(dtype.newbyteorder("="))


@dataclass
class RoundDecisions:
    """The inferences of one learned phase in one round, in the order they were made.

    `behaviour_probs[i]` is the probability with which the serving policy took `actions[i]`
    given `masks[i]`, exploration included (what importance weights divide by);
    `policy_probs[i]` is the network's own probability of that action."""

    algorithm: str  # dl2, chic, ...
    phase: str  # allocation | placement | grouping
    kind: str  # round | admission
    time: str  # RFC 3339, when the decision was made
    model_sha256: str
    model_version: str | None  # the published version (retraining), None for a file or shipped model
    encoder: str
    encoder_version: str
    encoder_params: dict[str, Any]
    epsilon: float  # the exploration applied while serving
    states: np.ndarray  # (steps, state_dim) float32
    masks: np.ndarray  # (steps, n_actions) bool
    actions: np.ndarray  # (steps,) int64
    behaviour_probs: np.ndarray  # (steps,) float32
    policy_probs: np.ndarray  # (steps,) float32
    granted: np.ndarray  # (steps,) bool: the ledger accepted the action (the stop action: False)
    windows: np.ndarray  # (steps,) int32: which window (DL²) or decision group of the round
    # The cycle guard's doing (policies/cycle_guard.py): job -> [[ps, workers] it kept,
    # [ps, workers] the steps above decided]. The interval's grants are the kept counts, so a
    # transition rebuilt from these steps must not credit its reward to the decided ones.
    kept: dict[str, list[list[int]]] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return int(self.actions.shape[0])

    def to_json(self) -> dict[str, Any]:
        meta = {k: getattr(self, k) for k in ("algorithm", "phase", "kind", "time", "model_sha256",
                                              "model_version", "encoder", "encoder_version",
                                              "encoder_params", "epsilon")}
        # float16 halves the size; the encoders' features are scaled to a few units, where
        # float16 keeps three significant digits (retraining casts back to float32).
        arrays = {"states": _pack(self.states, "float16"), "masks": _pack(self.masks, "bool"),
                  "actions": _pack(self.actions, "int64"),
                  "behaviour_probs": _pack(self.behaviour_probs, "float32"),
                  "policy_probs": _pack(self.policy_probs, "float32"),
                  "granted": _pack(self.granted, "bool"), "windows": _pack(self.windows, "int32")}
        return {**meta, "arrays": arrays, **({"kept": self.kept} if self.kept else {})}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> RoundDecisions:
        arrays = {k: _unpack(v) for k, v in raw["arrays"].items()}
        arrays["states"] = arrays["states"].astype(np.float32)
        meta = {k: v for k, v in raw.items() if k != "arrays"}
        return cls(**meta, **arrays)


class DecisionRecorder:
    """Collects the steps of one phase's decisions in one round; `finish` returns them."""

    def __init__(self, *, algorithm: str, phase: str, kind: str, time: str, model_sha256: str,
                 model_version: str | None, encoder: str, encoder_version: str,
                 encoder_params: dict[str, Any], epsilon: float):
        self.meta = dict(algorithm=algorithm, phase=phase, kind=kind, time=time,
                         model_sha256=model_sha256, model_version=model_version, encoder=encoder,
                         encoder_version=encoder_version, encoder_params=dict(encoder_params),
                         epsilon=epsilon)
        self._rows: list[tuple] = []
        self._kept: dict[str, list[list[int]]] = {}

    def keep(self, kept: dict[str, tuple[tuple[int, int], tuple[int, int]]]) -> None:
        """The jobs the cycle guard kept this round (Decision.kept). Kept with the steps: a
        round with no step has no record (a learned allocation regrows every running job
        step by step, so a round that kept one made steps)."""
        for name, (held, decided) in kept.items():
            self._kept[name] = [list(held), list(decided)]

    def record(self, state: np.ndarray, mask: np.ndarray, action: int, behaviour_prob: float,
               policy_prob: float, granted: bool, window: int = 0) -> None:
        # Copies: actors update their state vector in place between steps.
        self._rows.append((np.array(state, dtype=np.float32), np.array(mask, dtype=bool),
                           int(action), float(behaviour_prob), float(policy_prob), bool(granted),
                           int(window)))

    def __len__(self) -> int:
        return len(self._rows)

    def finish(self) -> RoundDecisions | None:
        if not self._rows:
            return None
        states, masks, actions, mu, pi, granted, windows = zip(*self._rows)
        return RoundDecisions(**self.meta, states=np.stack(states), masks=np.stack(masks),
                              actions=np.array(actions, np.int64),
                              behaviour_probs=np.array(mu, np.float32),
                              policy_probs=np.array(pi, np.float32),
                              granted=np.array(granted, bool), windows=np.array(windows, np.int32),
                              kept=dict(self._kept))


@dataclass
class JobInterval:
    """One job in one closed interval: who it is, what it was given, what it trained."""

    name: str
    uid: str
    model_type: str  # spec.modelType (a catalog name or the user's own)
    architecture: str  # ParameterServer | AllReduce
    total_epochs: float
    created: str  # RFC 3339 (arrival time, for traces rebuilt from the dataset)
    ps: int
    workers: int
    placement: dict[str, list[str]]  # role -> node per ordinal
    epochs_at_start: float
    epochs: float  # trained in the interval
    reward: float  # epochs / total_epochs
    finished: bool = False  # the job completed during the interval
    # What the job measured at these counts (its latest report in the interval), if it
    # reported: the real speed, where `epochs` also holds the time a restart cost.
    speed: float | None = None  # epochs/s
    samples_per_second: float | None = None
    # The counts the job allows (spec.replicaSpecs' min and max; None in records before
    # version 3): a replay of the window may not give it more than it could get.
    min_ps: int | None = None
    max_ps: int | None = None
    min_workers: int | None = None
    max_workers: int | None = None


@dataclass
class IntervalRecord:
    """One closed interval of one SchedulingPolicy: the dataset's unit (one per interval)."""

    namespace: str
    policy: str
    policy_uid: str
    interval: int  # the number in status.rewards / status.history
    start: str  # RFC 3339
    end: str
    length_s: float  # the interval's wall length (reward per interval depends on it)
    algorithms: dict[str, str]  # phase -> algorithm in force
    nodes: int  # nodes the policy could use
    reward: float  # sum of the jobs' rewards (status.rewards[].reward)
    jobs: list[JobInterval] = field(default_factory=list)
    decisions: list[RoundDecisions] = field(default_factory=list)  # empty for heuristics

    def to_bytes(self) -> bytes:
        doc = {"format": FORMAT, "version": FORMAT_VERSION,
               **{k: getattr(self, k) for k in ("namespace", "policy", "policy_uid", "interval",
                                                "start", "end", "length_s", "algorithms", "nodes",
                                                "reward")},
               "jobs": [vars(j) for j in self.jobs],
               "decisions": [d.to_json() for d in self.decisions]}
        # mtime=0: the same record always gives the same bytes (a rewrite is a no-op). Level 6:
        # level 9 took 4x longer on a 1,000-job round's states (0.8 s vs 0.18 s) for 6 % less.
        return gzip.compress(json.dumps(doc, separators=(",", ":")).encode(), compresslevel=6,
                             mtime=0)

    @classmethod
    def from_bytes(cls, data: bytes) -> IntervalRecord:
        try:
            doc = json.loads(gzip.decompress(data))
        except (OSError, EOFError, ValueError) as exc:
            raise ValueError(f"not an interval record (gzip'd JSON expected): {exc}") from None
        if doc.get("format") != FORMAT:
            raise ValueError(f"not an interval record: format {doc.get('format')!r}")
        if doc.get("version") not in READS:
            raise ValueError(f"interval record format version {doc.get('version')!r}; this mlsched "
                             f"reads versions {', '.join(map(str, READS))}")
        jobs = [JobInterval(**j) for j in doc.pop("jobs")]
        decisions = [RoundDecisions.from_json(d) for d in doc.pop("decisions")]
        del doc["format"], doc["version"]
        return cls(**doc, jobs=jobs, decisions=decisions)
