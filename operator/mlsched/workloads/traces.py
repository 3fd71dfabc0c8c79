"""Trace files: plain CSV, `name,arrival_s,model,epochs,arch,workers,ps[,gpu_types]`.

`arch` (ps | allreduce, default ps), `workers` and `ps` (the counts the user asked for, used by
the `fixed` allocation policy) may be empty or absent. `gpu_types` (optional) restricts the
GPU types a job's workers may run on, `|`-separated (`v100|p100`), as an MLJob's
`spec.replicaSpecs.worker.gpuTypes` does; empty: any (sim/gpu_restrictions.py). Rows may come in any order; jobs are
returned sorted by arrival. Every error names the file, the line and the reason.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

from mlsched.workloads import catalog, gpu_types as gpu_type_names

REQUIRED = ("name", "arrival_s", "model", "epochs")
OPTIONAL = ("arch", "workers", "ps", "gpu_types")
HEADER = REQUIRED + OPTIONAL


class TraceError(ValueError):
    pass


@dataclass(frozen=True)
class TraceJob:
    name: str
    arrival_s: float
    model: str
    epochs: float
    arch: str = "ps"
    workers: int | None = None
    ps: int | None = None
    gpu_types: tuple[str, ...] = ()  # the types its workers may use; () any


def _number(text: str, what: str, where: str, integer: bool = False) -> float:
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        kind = "a whole number" if integer else "a number"
        raise TraceError(f"{where}: {what} must be {kind}, got {text!r}") from None
    if not math.isfinite(value):
        raise TraceError(f"{where}: {what} must be finite, got {text!r}")
    return value


def parse(text: str, source: str = "<trace>") -> list[TraceJob]:
    reader = csv.reader(io.StringIO(text))
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise TraceError(f"{source}: empty file; expected header {','.join(HEADER)}") from None
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise TraceError(f"{source}:1: missing column(s) {', '.join(missing)}; "
                         f"expected header {','.join(HEADER)}")
    unknown = [c for c in header if c not in HEADER]
    if unknown:
        raise TraceError(f"{source}:1: unknown column(s) {', '.join(unknown)}")
    col = {name: header.index(name) for name in header}
    jobs: list[TraceJob] = []
    seen: dict[str, int] = {}
    for lineno, row in enumerate(reader, start=2):
        if not row or all(not c.strip() for c in row):
            continue
        where = f"{source}:{lineno}"
        if len(row) != len(header):
            raise TraceError(f"{where}: expected {len(header)} fields, got {len(row)}")
        get = lambda c: row[col[c]].strip() if c in col else ""  # noqa: E731
        name = get("name")
        if not name:
            raise TraceError(f"{where}: name is empty")
        if name in seen:
            raise TraceError(f"{where}: duplicate job name {name!r} (first on line {seen[name]})")
        seen[name] = lineno
        arrival = _number(get("arrival_s"), "arrival_s", where)
        if arrival < 0:
            raise TraceError(f"{where}: arrival_s must be >= 0, got {arrival}")
        try:
            model = catalog.canonical_name(get("model"))
        except catalog.UnknownModelError as exc:
            raise TraceError(f"{where}: {exc}") from None
        epochs = _number(get("epochs"), "epochs", where)
        if epochs <= 0:
            raise TraceError(f"{where}: epochs must be > 0, got {get('epochs')}")
        arch = get("arch").lower() or "ps"
        if arch not in ("ps", "allreduce"):
            raise TraceError(f"{where}: arch must be 'ps' or 'allreduce', got {get('arch')!r}")
        counts = {}
        for c in ("workers", "ps"):
            counts[c] = None
            if get(c):
                v = int(_number(get(c), c, where, integer=True))
                if v < 0 or (c == "workers" and v == 0):
                    raise TraceError(f"{where}: {c} must be {'>= 1' if c == 'workers' else '>= 0'}, got {v}")
                counts[c] = v
        if arch == "allreduce" and counts["ps"]:
            raise TraceError(f"{where}: an allreduce job has no parameter servers (ps={counts['ps']})")
        try:
            types = tuple(dict.fromkeys(gpu_type_names.canonical_type(t)
                                        for t in get("gpu_types").split("|") if t.strip()))
        except gpu_type_names.UnknownGpuTypeError as exc:
            raise TraceError(f"{where}: gpu_types: {exc}") from None
        jobs.append(TraceJob(name, arrival, model, epochs, arch, counts["workers"], counts["ps"], types))
    if not jobs:
        raise TraceError(f"{source}: no jobs")
    jobs.sort(key=lambda j: (j.arrival_s, j.name))
    return jobs


def read(path: str | Path) -> list[TraceJob]:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise TraceError(f"{p}: cannot read trace: {exc.strerror}") from None
    return parse(text, str(p))


def dumps(jobs: list[TraceJob]) -> str:
    """The CSV of `jobs`; the `gpu_types` column only when some job has a restriction."""
    typed = any(j.gpu_types for j in jobs)
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(HEADER if typed else HEADER[:-1])
    for j in jobs:
        row = [j.name, f"{j.arrival_s:.1f}", j.model, f"{j.epochs:g}", j.arch,
               "" if j.workers is None else j.workers, "" if j.ps is None else j.ps]
        w.writerow(row + ["|".join(j.gpu_types)] if typed else row)
    return out.getvalue()


def write(jobs: list[TraceJob], path: str | Path) -> None:
    Path(path).write_text(dumps(jobs))
