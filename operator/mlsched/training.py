"""What a training program needs from mlsched, in a few lines, for any framework.

    from mlsched import training
    topo = training.topology()                      # who am I, who are my peers
    store = training.CheckpointStore()              # the job's shared `checkpoint` volume
    stop = training.StopSignal()                    # SIGTERM: save at a step boundary, exit 0
    progress = training.ProgressReporter.from_env()
    resume = store.latest()                         # None on a fresh start
    ...
    store.save("e0003-s0000", lambda d: torch.save(state, d / "model.pt"), meta={...})

A rescale is a checkpoint-restart: the operator changes the pods' environment, the kubelet sends
the old pods SIGTERM and waits their grace period (30 s unless the template says otherwise)
before SIGKILL, and the new pods resume from the newest complete checkpoint. Standard library
only, and no torch: this module is imported by training images of any framework.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlsched import progress

log = logging.getLogger("mlsched.training")
ARCHITECTURES = ("ParameterServer", "AllReduce")


class TrainingEnvError(RuntimeError):
    """The environment is not an mlsched pod's (a variable missing or malformed)."""


# ------------------------------------------------------------------------------ topology


@dataclass(frozen=True)
class Topology:
    architecture: str  # "ParameterServer" or "AllReduce"
    role: str          # "ps" or "worker"
    index: int         # the pod's ordinal within its role
    job: str
    namespace: str
    epochs: float      # what the MLJob asks for; may be fractional
    ps_hosts: tuple[str, ...]
    worker_hosts: tuple[str, ...]
    # AllReduce: what torch.distributed's env:// and torchrun read.
    world_size: int | None = None
    rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    # ParameterServer: TF_CONFIG. hash=False: a dict is not hashable, the rest still is.
    cluster: dict[str, tuple[str, ...]] | None = field(default=None, hash=False)
    task_type: str | None = None
    task_index: int | None = None

    @property
    def is_chief(self) -> bool:
        """The one process that reports progress and writes shared files: worker 0."""
        return self.role == "worker" and self.index == 0


def _need(env: Mapping[str, str], name: str) -> str:
    if not env.get(name):
        raise TrainingEnvError(f"{name} is not set: not running in an mlsched training pod?")
    return env[name]


def _number(env: Mapping[str, str], name: str, kind: type = int, minimum: float = 0) -> Any:
    raw = _need(env, name)
    try:
        value = kind(raw)
    except ValueError:
        raise TrainingEnvError(f"{name}={raw!r} is not a{'n integer' if kind is int else ' number'}") from None
    if value < minimum:
        raise TrainingEnvError(f"{name}={raw!r} must be >= {minimum}")
    return value


def topology(env: Mapping[str, str] | None = None) -> Topology:
    """Reads and cross-checks the pod's environment, so that a wrong rendering fails at start
    with the variable's name instead of hanging in a rendezvous that can never complete."""
    env = os.environ if env is None else env
    arch, role = _need(env, "MLSCHED_ARCHITECTURE"), _need(env, "MLSCHED_ROLE")
    if arch not in ARCHITECTURES:
        raise TrainingEnvError(f"MLSCHED_ARCHITECTURE={arch!r}: expected one of {ARCHITECTURES}")
    if role not in ("ps", "worker") or (arch == "AllReduce" and role != "worker"):
        raise TrainingEnvError(f"MLSCHED_ROLE={role!r} is not a role of a {arch} job")
    index = _number(env, "MLSCHED_REPLICA_INDEX")
    hosts = {r: tuple(h for h in env.get(f"MLSCHED_{r.upper()}_HOSTS", "").split(",") if h)
             for r in ("ps", "worker")}
    if index >= len(hosts[role]):
        raise TrainingEnvError(f"MLSCHED_REPLICA_INDEX={index} but MLSCHED_{role.upper()}_HOSTS "
                               f"lists {len(hosts[role])} host(s)")
    base = dict(architecture=arch, role=role, index=index, job=_need(env, "MLSCHED_JOB_NAME"),
                namespace=_need(env, "MLSCHED_NAMESPACE"),
                epochs=_number(env, "MLSCHED_EPOCHS", float),
                ps_hosts=hosts["ps"], worker_hosts=hosts["worker"])
    if not base["epochs"] > 0:  # also NaN
        raise TrainingEnvError(f"MLSCHED_EPOCHS={env['MLSCHED_EPOCHS']!r} must be > 0")
    if arch == "AllReduce":
        world, rank = _number(env, "WORLD_SIZE", minimum=1), _number(env, "RANK")
        if rank != index or world != len(hosts["worker"]):
            raise TrainingEnvError(f"RANK={rank}, WORLD_SIZE={world} disagree with MLSCHED_REPLICA"
                                   f"_INDEX={index} and {len(hosts['worker'])} worker host(s)")
        return Topology(**base, world_size=world, rank=rank, master_addr=_need(env, "MASTER_ADDR"),
                        master_port=_number(env, "MASTER_PORT", minimum=1))
    try:
        config = json.loads(_need(env, "TF_CONFIG"))
        cluster = {k: tuple(str(h) for h in v) for k, v in config["cluster"].items()}
        task_type, task_index = str(config["task"]["type"]), int(config["task"]["index"])
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise TrainingEnvError(f"TF_CONFIG is not {{cluster: {{ps, worker}}, task: {{type, "
                               f"index}}}}: {err!r}") from None
    if (task_type, task_index) != (role, index) or not cluster.get("ps") or \
            [len(cluster.get(r, ())) for r in ("ps", "worker")] != [len(h) for h in hosts.values()]:
        raise TrainingEnvError(f"TF_CONFIG (task {task_type} {task_index}, cluster {cluster}) "
                               f"disagrees with MLSCHED_ROLE/REPLICA_INDEX/*_HOSTS")
    return Topology(**base, cluster=cluster, task_type=task_type, task_index=task_index)


# ------------------------------------------------------------------------------ checkpoints


def checkpoint_dir(path: str | os.PathLike | None = None,
                   env: Mapping[str, str] | None = None) -> Path:
    """The shared checkpoint volume: `path`, else MLSCHED_CHECKPOINT_DIR (the mountPath of the
    pod template's volume named `checkpoint`)."""
    env = os.environ if env is None else env
    where = path if path is not None else env.get("MLSCHED_CHECKPOINT_DIR")
    if not where:
        raise TrainingEnvError("MLSCHED_CHECKPOINT_DIR is not set: declare a volume named "
                               "`checkpoint` in the MLJob's pod templates and mount it")
    return Path(where)


def _fsync(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    # Files first, then the directories that name them: after a power cut the rename must not
    # point at data that never reached the disk.
    for dirpath, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            _fsync(os.path.join(dirpath, name))
        _fsync(dirpath)


@dataclass(frozen=True)
class Checkpoint:
    parts: tuple[Path, ...]             # directories written by save(); one per writer
    meta: dict[str, Any] = field(hash=False)

    @property
    def path(self) -> Path:
        """The directory of a single-writer checkpoint."""
        return self.parts[0]


class CheckpointStore:
    """A checkpoint is one or more directories (one per writer: a parameter server each) that
    the `latest` file names. A directory is written under a `.partial-` name and renamed only
    when complete, and `latest` is replaced (atomically) only after every part it names exists:
    a process killed mid-save leaves the previous checkpoint whole. Final names carry a unique
    suffix, so saving the same step twice never touches the copy that `latest` names. The
    store touches only its own names (`latest`, `ckpt-*`, `.partial-*`): the volume may hold
    other things."""

    POINTER, PREFIX, PARTIAL = "latest", "ckpt-", ".partial-"

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = checkpoint_dir(root)

    def save(self, name: str, write: Callable[[Path], None], *, publish: bool = True,
             meta: Mapping[str, Any] | None = None) -> Path:
        """Calls `write(directory)`, which writes the caller's files (torch.save, ...) into an
        empty directory, then makes it durable and renames it into place. With publish=False
        (one part of a multi-writer checkpoint) the caller publishes all parts afterwards."""
        self.root.mkdir(parents=True, exist_ok=True)
        suffix = uuid.uuid4().hex[:8]
        staging = self.root / f"{self.PARTIAL}{name}-{suffix}"
        staging.mkdir()
        write(staging)
        _fsync_tree(staging)
        final = self.root / f"{self.PREFIX}{name}-{suffix}"
        os.rename(staging, final)
        _fsync(self.root)
        if publish:
            self.publish([final], meta or {})
        return final

    def publish(self, parts: Sequence[str | os.PathLike], meta: Mapping[str, Any]) -> None:
        """Points `latest` at `parts` (all written by save()): written to a temp file, fsynced,
        renamed over the old pointer."""
        names = [Path(p).name for p in parts]
        missing = [n for n in names if not (self.root / n).is_dir()]
        if missing:
            raise FileNotFoundError(f"cannot publish a checkpoint with missing parts: {missing}")
        tmp = self.root / f"{self.PARTIAL}{self.POINTER}-{uuid.uuid4().hex[:8]}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"parts": names, "meta": dict(meta)}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.root / self.POINTER)
        _fsync(self.root)

    def latest(self) -> Checkpoint | None:
        """The newest complete checkpoint, None when nothing was ever published."""
        try:
            pointer = json.loads((self.root / self.POINTER).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        parts = tuple(self.root / n for n in pointer["parts"])
        return Checkpoint(parts=parts, meta=pointer.get("meta") or {})

    def prune(self) -> list[str]:
        """Removes older checkpoints and the leftovers of interrupted saves. Call it only where
        no other writer can be mid-save (right after publishing, in the process that does)."""
        current = self.latest()
        keep = {self.POINTER} | {p.name for p in (current.parts if current else ())}
        removed = sorted(e.name for e in self.root.iterdir() if e.name not in keep
                         and e.name.startswith((self.PREFIX, self.PARTIAL)))
        for name in removed:
            entry = self.root / name
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        return removed


# ------------------------------------------------------------------------------ SIGTERM


class StopSignal:
    """SIGTERM (what the kubelet sends before a rescale or an eviction) sets a flag instead of
    killing the process, so the training loop can finish its step, save and exit 0 within the
    grace period. Check `requested` between steps."""

    def __init__(self, signals: Sequence[int] = (signal.SIGTERM,)):
        self._event = threading.Event()
        self.received_at: float | None = None  # time.monotonic() of the first signal
        # A handler installed before (another StopSignal, the framework's own) still runs:
        # signal.signal would silently replace it.
        self._previous = {sig: signal.signal(sig, self._handle) for sig in signals}

    def _handle(self, signum: int, frame: Any) -> None:
        previous = self._previous.get(signum)
        if callable(previous):
            previous(signum, frame)
        if not self._event.is_set():
            self.received_at = time.monotonic()
            self._event.set()
            # Only a flag and one write: a handler runs between bytecodes of whatever the
            # program was doing, and logging takes locks.
            os.write(2, f"mlsched.training: got signal {signum}, stopping at the next step\n".encode())

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def request(self) -> None:
        """Stop as if signalled (a program's own reason to stop, or a test's)."""
        self._handle(0, None)


_default_stop: StopSignal | None = None


def stop_requested() -> bool:
    """Installs the SIGTERM handler on first use (call it once at start), then tells whether
    SIGTERM arrived."""
    global _default_stop
    if _default_stop is None:
        _default_stop = StopSignal()
    return _default_stop.requested


# ------------------------------------------------------------------------------ progress


class ProgressReporter:
    """Reports cumulative epochs and the samples/s measured since the previous report, at most
    every `min_interval_s` (the operator needs a trend, not every step) and at every epoch end.
    A failed report warns and training goes on: the operator being unreachable for a while
    must not stop a job."""

    def __init__(self, reporter: progress.Reporter | None, *, min_interval_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic):
        self.reporter, self.min_interval_s, self.clock = reporter, min_interval_s, clock
        self._since, self._samples = clock(), 0
        self.last_samples_per_second: float | None = None

    def start(self) -> None:
        """Starts measuring now: call it when the first step begins, so that start-up (imports,
        rendezvous, loading a checkpoint) does not count against the speed."""
        self._since, self._samples = self.clock(), 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **kw: Any) -> ProgressReporter:
        try:
            reporter = progress.Reporter.from_env(dict(os.environ if env is None else env))
        except progress.ProgressError as err:
            log.warning("progress will not be reported: %s", err)
            reporter = None
        return cls(reporter, **kw)

    def step(self, epochs_done: float, samples: int, *, epoch_end: bool = False) -> bool:
        """Counts `samples` trained; reports when due. True when a report was accepted."""
        self._samples += samples
        now = self.clock()
        if not epoch_end and now - self._since < self.min_interval_s:
            return False
        return self.report(epochs_done, now)

    def report(self, epochs_done: float, now: float | None = None) -> bool:
        now = self.clock() if now is None else now
        elapsed = now - self._since
        rate = self._samples / elapsed if self._samples and elapsed > 0 else None
        self._since, self._samples = now, 0
        if rate is not None:
            self.last_samples_per_second = rate
        if self.reporter is None:
            return False
        try:
            return self.reporter.report(epochs_done, samples_per_second=rate)
        except Exception as err:  # noqa: BLE001 - nothing in a report may stop training
            log.warning("progress report failed: %s", err)
            return False
