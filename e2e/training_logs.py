"""What the reference programs (examples/pytorch) log, read back by the tests that run them:
the steps each process trained (EXAMPLE_TRACE_STEPS=1), where a run started and stopped, its
losses and speed, and the checks every rescale must pass (no sample lost or trained twice, each
run resuming where the last stopped, with the model it stopped with)."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence

from pod_runner import PodProcess

TRACE = re.compile(r"trained epoch=(\d+) step=(\d+) rows=(\d+):(\d+) worker=(\d+)/(\d+)")
START = re.compile(r"start at epoch (\d+) step (\d+) .*train loss ([\d.]+), test accuracy ([\d.]+)")
STOPPING = re.compile(r"stopping at epoch (\d+) step (\d+) \(SIGTERM\)")
STOP_LOSS = re.compile(r"\(SIGTERM\): train loss ([\d.]+)")
EPOCH_DONE = re.compile(r"epoch (\d+) done: train loss ([\d.]+), test accuracy ([\d.]+), "
                        r"(\d+) samples in [\d.]+ s = (\d+) samples/s")
SAVED = re.compile(r"saved at epoch (\d+) step (\d+) in ([\d.]+) s")

TRAIN_SIZE = 1437  # 80 % of load_digits()'s 1,797 samples (common.load_data)


def steps_per_epoch(global_batch: int) -> int:
    return -(-TRAIN_SIZE // global_batch)


def logged(pods: Sequence[PodProcess], pattern: re.Pattern) -> list[tuple]:
    return [m.groups() for p in pods for m in pattern.finditer(p.log())]


def check_every_step_trained_once(runs: Sequence[Sequence[PodProcess]], epochs: int,
                                  global_batch: int) -> None:
    """Every (epoch, step) of the job in exactly one run, its rows split exactly among that
    run's workers: no sample lost, none trained twice, whatever the worker counts were."""
    per_epoch = steps_per_epoch(global_batch)
    seen: dict[tuple[int, int], list[tuple[int, int, int, int]]] = defaultdict(list)
    for n, run in enumerate(runs):
        for e, s, lo, hi, rank, world in logged(run, TRACE):
            seen[int(e), int(s)].append((n, int(lo), int(hi), int(world)))
    expected = {(e, s) for e in range(epochs) for s in range(per_epoch)}
    assert set(seen) == expected, (f"missing {sorted(expected - set(seen))[:5]}, "
                                   f"unexpected {sorted(set(seen) - expected)[:5]}")
    for (epoch, step), parts in seen.items():
        assert len({n for n, *_ in parts}) == 1, f"({epoch}, {step}) trained in runs {parts}"
        world = parts[0][3]
        assert len(parts) == world, f"({epoch}, {step}): {len(parts)} parts for {world} workers"
        rows = sorted((lo, hi) for _, lo, hi, _ in parts)
        batch = (step * global_batch, min((step + 1) * global_batch, TRAIN_SIZE))
        assert rows[0][0] == batch[0] and rows[-1][1] == batch[1] and \
            all(a[1] == b[0] for a, b in zip(rows, rows[1:])), f"({epoch}, {step}): rows {rows}"


def check_resumed_where_stopped(runs: Sequence[Sequence[PodProcess]], global_batch: int,
                                mid_epoch: bool = True) -> list[tuple[int, int]]:
    """Each run starts at the (epoch, step) the previous one stopped at (mid-epoch unless told
    otherwise), with the model it stopped with (the same training loss, to the 4 decimals
    logged). The stops, in order."""
    stops = []
    for before, after in zip(runs, runs[1:]):
        stopped = set(logged(before, STOPPING))
        assert len(stopped) == 1, f"processes disagree where they stopped: {stopped}"
        epoch, step = map(int, stopped.pop())
        if mid_epoch:
            assert 0 < step < steps_per_epoch(global_batch), \
                f"stopped at a step boundary of an epoch: {step}"
        started = logged(after, START)
        assert [(int(e), int(s)) for e, s, *_ in started] == [(epoch, step)]
        assert logged(before, STOP_LOSS) == [(started[0][2],)], "the model changed in the checkpoint"
        stops.append((epoch, step))
    return stops
