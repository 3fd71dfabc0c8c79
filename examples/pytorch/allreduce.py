"""Reference all-reduce program for an mlsched `AllReduce` MLJob: data-parallel PyTorch (CPU,
gloo), one process per worker pod.

    containers: [{name: worker, command: [python, examples/pytorch/allreduce.py],
                  volumeMounts: [{name: checkpoint, mountPath: /checkpoint}]}]

torch.distributed initialises from the variables the operator renders (MASTER_ADDR,
MASTER_PORT, WORLD_SIZE, RANK: `init_method="env://"`), so a wrong rendering fails here.
Rank 0 writes the checkpoint (model, optimizer, epoch and step) to the job's `checkpoint`
volume at every epoch end and on SIGTERM; every rank reads it when it starts, with whatever
worker count the operator chose this time (the batch schedule in common.py makes that
lossless). Exits 0 when MLSCHED_EPOCHS are trained.
"""

from __future__ import annotations

import logging
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import common
from mlsched import training

log = logging.getLogger("example")


def main() -> int:
    args = common.parse_args(__doc__.splitlines()[0])
    common.setup_logging()
    topo = training.topology()
    if topo.architecture != "AllReduce":
        sys.exit(f"this program runs AllReduce jobs, not {topo.architecture}: use parameter_server.py")
    store = training.CheckpointStore()
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()

    data = common.load_data()
    schedule = common.Schedule(data.train_size, args.global_batch_size, topo.epochs)
    model = common.make_model(args.hidden, args.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    first = 0
    resume = store.latest()
    if resume is not None:
        state = torch.load(resume.path / "state.pt")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first = state["epoch"] * schedule.steps_per_epoch + state["step"]
    # DDP broadcasts rank 0's parameters; every rank loaded the same checkpoint anyway, and each
    # needs the optimizer's momentum, which DDP does not share.
    ddp = DistributedDataParallel(model)
    chief = rank == 0
    reporter = training.ProgressReporter.from_env(min_interval_s=args.report_interval) if chief else None
    if chief:
        loss, acc = common.evaluate(model, data)
        log.info("start at epoch %d step %d of %d steps/epoch (%s), %d worker(s): train loss %.4f, "
                 "test accuracy %.4f", *schedule.position(first), schedule.steps_per_epoch,
                 f"resumed from {resume.path.name}" if resume else "fresh", world, loss, acc)

    saved = first if resume else None
    def save(global_step: int) -> None:
        nonlocal saved
        if not chief or saved == global_step:
            return
        epoch, step = schedule.position(global_step)
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                 "epoch": epoch, "step": step}
        started = time.monotonic()
        store.save(common.checkpoint_name(epoch, step), lambda d: torch.save(state, d / "state.pt"),
                   meta={"epoch": epoch, "step": step})
        store.prune()
        saved = global_step
        after = f", {time.monotonic() - stop.received_at:.3f} s after SIGTERM" if stop.requested else ""
        log.info("checkpoint saved at epoch %d step %d in %.3f s%s", epoch, step,
                 time.monotonic() - started, after)

    # From here on SIGTERM stops the job at a step boundary, with a checkpoint. Before, it kills
    # at once (the default action), which is right: there is nothing to save yet, and a process
    # blocked in the rendezvous (pods of an old allocation that the kubelet restarted) would
    # otherwise wait out the whole grace period.
    stop = training.StopSignal()
    pacer = common.StepPacer()
    flag = torch.zeros(1)
    epoch_started, epoch_samples = time.monotonic(), 0
    if reporter:
        reporter.start()
    global_step = first
    while global_step < schedule.total_steps:
        pacer.begin()
        # The ranks must stop at the same step (SIGTERM reaches the pods at slightly different
        # times, and a rank that stops alone leaves the others blocked in the next all-reduce):
        # one float, MAX-reduced, costs far less than the gradients.
        flag[0] = 1.0 if stop.requested else 0.0
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag[0] > 0:
            break
        epoch, step = schedule.position(global_step)
        if step == 0 or global_step == first:
            order = schedule.order(args.seed, epoch)
        rows = schedule.part(step, rank, world)
        lo, hi = schedule.batch(step)
        index = order[rows[0]:rows[1]]
        loss_sum = torch.nn.functional.cross_entropy(ddp(data.train_x[index]), data.train_y[index],
                                                     reduction="sum")
        # DDP averages the gradients over ranks; scaling by world/(batch) makes the average
        # the gradient of the global batch's mean loss, however the batch was split.
        (loss_sum * (world / (hi - lo))).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        common.trace_step(epoch, step, rows, f"{rank}/{world}")
        pacer.end(rows[1] - rows[0])
        global_step += 1
        epoch_samples += hi - lo
        if reporter:
            reporter.step(global_step / schedule.steps_per_epoch, hi - lo,
                          epoch_end=schedule.is_epoch_end(global_step - 1))
        if schedule.is_epoch_end(global_step - 1):
            elapsed = time.monotonic() - epoch_started
            if chief:
                loss, acc = common.evaluate(model, data)
                log.info("epoch %d done: train loss %.4f, test accuracy %.4f, %d samples in "
                         "%.2f s = %.0f samples/s with %d worker(s)", epoch + 1, loss, acc,
                         epoch_samples, elapsed, epoch_samples / elapsed, world)
            save(global_step)
            epoch_started, epoch_samples = time.monotonic(), 0

    if global_step < schedule.total_steps:
        # The loss here is what the next run must start from: a check of the checkpoint.
        loss = f": train loss {common.evaluate(model, data)[0]:.4f}" if chief else ""
        log.info("stopping at epoch %d step %d (SIGTERM)%s", *schedule.position(global_step), loss)
        save(global_step)
    else:
        log.info("all %g epochs trained", topo.epochs)
    if reporter:
        reporter.report(global_step / schedule.steps_per_epoch)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    common.exit_now(main())
