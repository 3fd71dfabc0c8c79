"""What both reference programs share: the data, the model, and the batch schedule.

The schedule is what makes a rescale lossless. The global batch size is fixed whatever the
worker count; epoch e visits the training set in a permutation drawn from (seed, e); step k of
an epoch is rows [k*B, (k+1)*B) of that permutation (the last step takes the remainder), split
into contiguous parts, one per current worker. A checkpoint at (epoch, step) therefore means the
same samples whoever resumes it: any number of workers continues at exactly the next sample,
none skipped, none seen twice in one epoch.

The data is scikit-learn's `load_digits()` (8x8 handwritten digits, 1,797 samples), which ships
inside scikit-learn: a training pod needs no network and no dataset volume.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time
from dataclasses import dataclass

INSTALL = "install the examples' dependencies: pip install 'mlsched[examples]' (torch, scikit-learn)"
try:
    import torch
    from torch import nn
except ImportError as err:
    sys.exit(f"{err}: {INSTALL}")

#: Debug knobs, read from the environment so a pod template can set them.
TRACE_STEPS = "EXAMPLE_TRACE_STEPS"  # "1": log every trained step and its rows (tests count them)
SAMPLE_COST_S = "EXAMPLE_SAMPLE_COST_S"  # pad each step to this many seconds per sample the
                                         # process trained: a bigger model's compute, which
                                         # divides among the workers (tests: to signal a run
                                         # mid-epoch and to see speed change with the count)

log = logging.getLogger("example")


def parse_args(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--global-batch-size", type=int, default=64,
                        help="samples per step over all workers; fixed across rescales")
    parser.add_argument("--hidden", type=int, default=256, help="width of the MLP's two hidden layers")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=1, help="model init and epoch permutations")
    parser.add_argument("--report-interval", type=float, default=5.0,
                        help="seconds between progress reports (plus one at every epoch end)")
    return parser.parse_args()


def setup_logging() -> None:
    # The pod name in every line: `kubectl logs` of several pods stays readable when merged.
    level = logging.DEBUG if os.environ.get(TRACE_STEPS) == "1" else logging.INFO
    pod = os.environ.get("MLSCHED_POD_NAME", "local")
    logging.basicConfig(level=level, stream=sys.stdout,
                        format=f"%(asctime)s {pod} %(levelname)s %(message)s")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or torch.get_num_threads()))


@dataclass(frozen=True)
class Data:
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor

    @property
    def train_size(self) -> int:
        return len(self.train_y)


def load_data() -> Data:
    """A fixed 80/20 split (its own seed, so that --seed changes the training, not the test)."""
    try:  # here, not at the top: parameter servers never touch the data (1.6 s less to start)
        from sklearn.datasets import load_digits
    except ImportError as err:
        sys.exit(f"{err}: {INSTALL}")
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0  # pixel values are 0..16
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(20240601))
    cut = int(0.8 * len(y))
    return Data(x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]])


def make_model(hidden: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)  # every process builds the same initial model
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, 10))


@dataclass(frozen=True)
class Schedule:
    train_size: int
    global_batch: int
    epochs: float

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.train_size / self.global_batch)

    @property
    def total_steps(self) -> int:
        # MLSCHED_EPOCHS may be fractional: stop at the nearest step.
        return max(1, round(self.epochs * self.steps_per_epoch))

    def position(self, global_step: int) -> tuple[int, int]:
        return divmod(global_step, self.steps_per_epoch)

    def is_epoch_end(self, global_step: int) -> bool:
        """After this step: the last of an epoch, or of the whole run."""
        return (global_step + 1) % self.steps_per_epoch == 0 or global_step + 1 == self.total_steps

    def order(self, seed: int, epoch: int) -> torch.Tensor:
        return torch.randperm(self.train_size,
                              generator=torch.Generator().manual_seed(seed * 100_003 + epoch))

    def batch(self, step: int) -> tuple[int, int]:
        lo = step * self.global_batch
        return lo, min(lo + self.global_batch, self.train_size)

    def part(self, step: int, index: int, parts: int) -> tuple[int, int]:
        """Worker `index` of `parts` takes a contiguous share of the step's batch; shares differ
        by at most one row."""
        lo, hi = self.batch(step)
        size, extra = divmod(hi - lo, parts)
        start = lo + index * size + min(index, extra)
        return start, start + size + (1 if index < extra else 0)


def evaluate(model: nn.Module, data: Data) -> tuple[float, float]:
    """(mean loss on the whole training set, accuracy on the test set): the same sets every
    time, so that losses logged by different runs and worker counts compare."""
    with torch.no_grad():
        loss = nn.functional.cross_entropy(model(data.train_x), data.train_y).item()
        accuracy = (model(data.test_x).argmax(1) == data.test_y).float().mean().item()
    return loss, accuracy


class StepPacer:
    """Honours EXAMPLE_SAMPLE_COST_S (0: no padding, the default): a step of `rows` samples takes
    at least rows x the cost, as a model that much bigger would compute; the communication is
    still the real one."""

    def __init__(self) -> None:
        self.sample_cost_s = float(os.environ.get(SAMPLE_COST_S) or 0)
        self.started = time.monotonic()

    def begin(self) -> None:
        self.started = time.monotonic()

    def end(self, rows: int) -> None:
        left = self.sample_cost_s * rows - (time.monotonic() - self.started)
        if left > 0:
            time.sleep(left)


def trace_step(epoch: int, step: int, rows: tuple[int, int], who: str) -> None:
    # One line per trained step and worker: the rows of the epoch's permutation it trained.
    log.debug("trained epoch=%d step=%d rows=%d:%d worker=%s", epoch, step, rows[0], rows[1], who)


def exit_now(code: int) -> None:
    """Exit without Python's finalization: with torch loaded it takes 1-3 s on a busy 2-core
    machine (tearing down thousands of modules and objects), time a rescale spends inside the
    pod's grace period while the new pods wait. Everything that matters is already durable
    (checkpoints are fsynced), so only the log is flushed."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def checkpoint_name(epoch: int, step: int) -> str:
    return f"e{epoch:05d}-s{step:05d}"
