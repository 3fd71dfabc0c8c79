"""Reference parameter-server program for an mlsched `ParameterServer` MLJob: PyTorch (CPU,
gloo point-to-point), one process per pod; its cluster and its place in it come from TF_CONFIG
alone (MLSCHED_EPOCHS and MLSCHED_CHECKPOINT_DIR say how long to train and where to save).

    TF_CONFIG={"cluster": {"ps": [...host:port], "worker": [...]}, "task": {"type", "index"}}

Every process meets at cluster.ps[0] (a `tcp://` rendezvous hosted by PS 0); its global rank is
its PS index, or the number of PS plus its worker index. The model's parameters, one flat
vector, are sharded over the PS in contiguous ranges. Each step every worker sends each PS the
gradient of that PS's range; the PS sums them (each is already scaled to the global batch),
applies SGD with momentum (the momentum lives on the PS) and sends the new range back.

Each PS checkpoints its own range, with the range recorded, at every epoch end and on SIGTERM;
once every range of one (epoch, step) is on disk, PS 0 publishes them together. A resume at
another PS count reassembles the whole vector from the recorded ranges and slices it anew; a
resume at another worker count continues the same batch schedule (common.py).
"""

from __future__ import annotations

import logging
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.utils import parameters_to_vector, vector_to_parameters

import common
from mlsched import training

log = logging.getLogger("example")


def shard_bounds(size: int, shards: int) -> list[tuple[int, int]]:
    """Contiguous ranges, sizes differing by at most one."""
    step, extra = divmod(size, shards)
    bounds, lo = [], 0
    for i in range(shards):
        hi = lo + step + (1 if i < extra else 0)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def load_vectors(resume: training.Checkpoint, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole parameter and momentum vectors, from the ranges every PS wrote."""
    params, momentum, covered = torch.empty(size), torch.empty(size), 0
    for part in resume.parts:
        shard = torch.load(part / "shard.pt")
        lo, hi = shard["range"]
        params[lo:hi], momentum[lo:hi] = shard["params"], shard["momentum"]
        covered += hi - lo
    if covered != size:
        raise RuntimeError(f"checkpoint {resume.parts} covers {covered} of {size} parameters")
    return params, momentum


def main() -> int:
    args = common.parse_args(__doc__.splitlines()[0])
    common.setup_logging()
    topo = training.topology()
    if topo.architecture != "ParameterServer":
        sys.exit(f"this program runs ParameterServer jobs, not {topo.architecture}: use allreduce.py")
    n_ps, n_workers = len(topo.cluster["ps"]), len(topo.cluster["worker"])
    rank = topo.task_index if topo.task_type == "ps" else n_ps + topo.task_index
    host, port = topo.cluster["ps"][0].rsplit(":", 1)
    dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=rank,
                            world_size=n_ps + n_workers)
    # Every rank creates the PS group (new_group is collective), only the PS use it.
    ps_group = dist.new_group(list(range(n_ps)))
    is_ps = topo.task_type == "ps"
    workers = [n_ps + w for w in range(n_workers)]

    # The PS never touch the data: worker 0 tells them its size, which the batch schedule
    # (steps per epoch, hence where epochs end and checkpoints go) is computed from.
    data = None if is_ps else common.load_data()
    train_size = torch.tensor([0 if is_ps else data.train_size])
    dist.broadcast(train_size, src=n_ps)
    schedule = common.Schedule(int(train_size[0]), args.global_batch_size, topo.epochs)
    model = common.make_model(args.hidden, args.seed)
    size = parameters_to_vector(model.parameters()).numel()
    bounds = shard_bounds(size, n_ps)

    # Where to start: PS 0 reads the checkpoint and tells everyone (workers need no volume).
    start = torch.zeros(1, dtype=torch.long)
    store = resume = None
    if is_ps:
        store = training.CheckpointStore()
        resume = store.latest()
        if rank == 0 and resume is not None:
            start[0] = resume.meta["epoch"] * schedule.steps_per_epoch + resume.meta["step"]
    dist.broadcast(start, src=0)
    first = int(start[0])

    if is_ps:
        run_ps(topo, args, schedule, store, resume, model, bounds, workers, ps_group, first)
    else:
        run_worker(topo, args, schedule, data, model, bounds, n_ps, first)
    dist.destroy_process_group()
    return 0


def agree_to_stop(stop: training.StopSignal, flag: torch.Tensor) -> bool:
    # All processes must stop at the same step (SIGTERM reaches the pods at slightly different
    # times): one float MAX-reduced over PS and workers, before any gradient moves.
    flag[0] = 1.0 if stop.requested else 0.0
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag[0] > 0


def run_ps(topo, args, schedule, store, resume, model, bounds, workers, ps_group,
           first: int) -> None:
    lo, hi = bounds[topo.task_index]
    if resume is not None:
        params, momentum = load_vectors(resume, bounds[-1][1])
        shard, buffer = params[lo:hi].clone(), momentum[lo:hi].clone()
    else:
        shard, buffer = parameters_to_vector(model.parameters())[lo:hi].clone(), torch.zeros(hi - lo)
    param = torch.nn.Parameter(shard)
    optimizer = torch.optim.SGD([param], lr=args.lr, momentum=args.momentum)
    # A zero buffer behaves exactly like none: SGD's first step sets buffer = gradient.
    optimizer.state[param]["momentum_buffer"] = buffer
    for w in workers:  # the workers start from the PS's parameters
        dist.send(param.data, dst=w)

    stop = training.StopSignal()  # from here on: at a step boundary (see allreduce.py)
    saved = first if resume is not None else None
    def save(global_step: int) -> None:
        nonlocal saved
        if saved == global_step:
            return
        epoch, step = schedule.position(global_step)
        shard = {"range": (lo, hi), "params": param.data.clone(),
                 "momentum": optimizer.state[param]["momentum_buffer"].clone(),
                 "epoch": epoch, "step": step}
        started = time.monotonic()
        name = f"{common.checkpoint_name(epoch, step)}-ps{topo.task_index}"
        part = store.save(name, lambda d: torch.save(shard, d / "shard.pt"), publish=False)
        parts = [None] * len(bounds) if topo.task_index == 0 else None
        # The gather is the barrier: PS 0 publishes only when every range is on disk.
        dist.gather_object(part.name, parts, dst=0, group=ps_group)
        if topo.task_index == 0:
            store.publish(parts, {"epoch": epoch, "step": step, "size": bounds[-1][1],
                                  "ranges": bounds})
            store.prune()
        saved = global_step
        after = f", {time.monotonic() - stop.received_at:.3f} s after SIGTERM" if stop.requested else ""
        log.info("checkpoint of range %d:%d saved at epoch %d step %d in %.3f s%s", lo, hi, epoch,
                 step, time.monotonic() - started, after)

    flag, grads = torch.zeros(1), [torch.empty(hi - lo) for _ in workers]
    global_step = first
    while global_step < schedule.total_steps:
        if agree_to_stop(stop, flag):
            break
        for request in [dist.irecv(g, src=w) for g, w in zip(grads, workers)]:
            request.wait()
        param.grad = torch.stack(grads).sum(0)
        optimizer.step()
        for request in [dist.isend(param.data, dst=w) for w in workers]:
            request.wait()
        global_step += 1
        if schedule.is_epoch_end(global_step - 1):
            save(global_step)
    if global_step < schedule.total_steps:
        log.info("stopping at epoch %d step %d (SIGTERM)", *schedule.position(global_step))
        save(global_step)


def run_worker(topo, args, schedule, data, model, bounds, n_ps, first: int) -> None:
    params = torch.empty(bounds[-1][1])
    for request in [dist.irecv(params[lo:hi], src=p) for p, (lo, hi) in enumerate(bounds)]:
        request.wait()
    vector_to_parameters(params, model.parameters())
    chief, index, n_workers = topo.is_chief, topo.task_index, len(topo.cluster["worker"])
    reporter = training.ProgressReporter.from_env(min_interval_s=args.report_interval) if chief else None
    if chief:
        loss, acc = common.evaluate(model, data)
        log.info("start at epoch %d step %d of %d steps/epoch, %d PS, %d worker(s): train loss "
                 "%.4f, test accuracy %.4f", *schedule.position(first), schedule.steps_per_epoch,
                 n_ps, n_workers, loss, acc)
        reporter.start()

    stop = training.StopSignal()  # from here on: at a step boundary (see allreduce.py)
    pacer, flag = common.StepPacer(), torch.zeros(1)
    epoch_started, epoch_samples = time.monotonic(), 0
    global_step = first
    while global_step < schedule.total_steps:
        pacer.begin()
        if agree_to_stop(stop, flag):
            break
        epoch, step = schedule.position(global_step)
        if step == 0 or global_step == first:
            order = schedule.order(args.seed, epoch)
        rows = schedule.part(step, index, n_workers)
        lo, hi = schedule.batch(step)
        batch = order[rows[0]:rows[1]]
        model.zero_grad(set_to_none=False)
        loss_sum = torch.nn.functional.cross_entropy(model(data.train_x[batch]),
                                                     data.train_y[batch], reduction="sum")
        (loss_sum / (hi - lo)).backward()  # the PS sums the workers': the global batch's mean
        grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        requests = [dist.isend(grad[a:b].contiguous(), dst=p) for p, (a, b) in enumerate(bounds)]
        requests += [dist.irecv(params[a:b], src=p) for p, (a, b) in enumerate(bounds)]
        for request in requests:
            request.wait()
        vector_to_parameters(params, model.parameters())
        common.trace_step(epoch, step, rows, f"{index}/{n_workers}")
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
                log.info("epoch %d done: train loss %.4f, test accuracy %.4f, %d samples in %.2f s"
                         " = %.0f samples/s with %d PS and %d worker(s)", epoch + 1, loss, acc,
                         epoch_samples, elapsed, epoch_samples / elapsed, n_ps, n_workers)
            epoch_started, epoch_samples = time.monotonic(), 0
    if global_step < schedule.total_steps:
        # The loss here is what the next run must start from: a check of the checkpoint.
        loss = f": train loss {common.evaluate(model, data)[0]:.4f}" if chief else ""
        log.info("stopping at epoch %d step %d (SIGTERM)%s", *schedule.position(global_step), loss)
    else:
        log.info("all %g epochs trained", topo.epochs)
    if reporter:
        reporter.report(global_step / schedule.steps_per_epoch)


if __name__ == "__main__":
    common.exit_now(main())
