"""Interval records from the simulator, the way the cluster records them (tests, benchmarks).

A "cluster" here is the simulator, optionally with per-model speed factors
(`perturbation`): a real cluster's jobs run at other speeds than the catalog's measured
table, and retraining has to find that out from the records alone. Every closed interval
becomes one `IntervalRecord` (the operator writes one per interval and policy): each job's
grant, placement and epochs trained, the interval's reward, and, for DL², every inference
of the round and of the admission steps inside the interval, with the behaviour and policy
probabilities of the epsilon-greedy serving policy (`ExploringActor`). A learned placement
(Harmony) explores and records through the operator's own serving code (formats/serving.py).

    python -m policy_models.retrain.history --out DIR --intervals 200 [--speed-perturbation 0.3]

writes DIR/<interval>.json.gz (IntervalRecord.to_bytes()) and DIR/perturbation.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterator

import numpy as np
from tqdm import tqdm

from mlsched.cluster.types import Decision
from mlsched.formats import serving
from mlsched.policies import registry
from mlsched.policies.allocation.dl2 import DL2Policy
from mlsched.policies.decision_log import DecisionRecorder, IntervalRecord, JobInterval
from mlsched.policies.onnx_runner import greedy_action, load_model
from mlsched.policies.round import run_admission, run_round
from mlsched.sim import scenarios
from mlsched.sim.simulator import SimConfig, Simulator
from mlsched.workloads import catalog, generators

EPOCH = datetime(2026, 1, 1, tzinfo=timezone.utc)  # wall time of simulated second 0
HISTORY_SEED_BASE = 300_000  # trace seeds of recorded histories: never training, validation or benchmark
ARCH = {"ps": "ParameterServer", "allreduce": "AllReduce"}


def rfc3339(seconds: float) -> str:
    return (EPOCH + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def perturbation(spread: float, seed: int) -> dict[str, float]:
    """A factor per catalog model, uniform in [1 - spread, 1 + spread]: the "cluster"'s speeds."""
    if not 0 <= spread < 1:
        raise ValueError(f"speed perturbation must be in [0, 1), got {spread}")
    rng = np.random.default_rng(seed)
    return {m: float(round(rng.uniform(1 - spread, 1 + spread), 4)) for m in catalog.MODEL_NAMES}


def sensitivity_perturbation(spread: float, seed: int) -> dict[str, float]:
    """A factor per catalog model on its interference sensitivity, log-uniform in
    [1 / (1 + spread), 1 + spread]: the "cluster"'s interference (seeded apart from the speeds)."""
    if spread < 0:
        raise ValueError(f"sensitivity perturbation must be >= 0, got {spread}")
    rng = np.random.default_rng([seed, 1])
    bound = np.log1p(spread)
    return {m: float(round(np.exp(rng.uniform(-bound, bound)), 4)) for m in catalog.MODEL_NAMES}


class ExploringActor:
    """Serving with exploration: the greedy action of the ONNX graph, replaced with probability
    `epsilon` by a uniformly random allowed one. Records, per inference, the probability the
    behaviour policy had of the action taken (what importance weights divide by) and the
    network's own probability of it."""

    def __init__(self, model, epsilon: float, rng: np.random.Generator):
        self.model, self.epsilon, self.rng = model, epsilon, rng
        self.recorder: DecisionRecorder | None = None
        self._state, self._window = None, -1
        self.last = (1.0, 1.0)

    def act(self, state, mask) -> int:
        if state is not self._state:  # a new window of the round
            self._state, self._window = state, self._window + 1
        probs = self.model.run({"state": state.vector[None, :], "mask": mask[None, :].astype(np.float32)})["probs"][0]
        greedy = greedy_action(probs, mask)
        allowed = np.flatnonzero(mask)
        action = int(self.rng.choice(allowed)) if self.rng.random() < self.epsilon else greedy
        self.last = ((1 - self.epsilon) * (action == greedy) + self.epsilon / len(allowed), float(probs[action]))
        return action

    def on_step(self, before, mask, action, granted) -> None:
        if self.recorder is not None:
            self.recorder.record(before, mask, action, self.last[0], self.last[1], granted, self._window)

    def start(self, kind: str, time: str) -> None:
        card = self.model.card
        self.recorder = DecisionRecorder(
            algorithm="dl2", phase="allocation", kind=kind, time=time, model_sha256=card.onnx_sha256,
            model_version=None, encoder=card.encoder_name, encoder_version=card.encoder_version,
            encoder_params=card.encoder_params, epsilon=self.epsilon)
        self._state, self._window = None, -1


class HistoryRecorder:
    """Runs traces through a simulated cluster with one allocation policy and yields one
    IntervalRecord per closed interval, numbered on from `first_interval` across traces."""

    def __init__(self, policy: str = "dl2", model_path: str | None = None, epsilon: float = 0.1,
                 nodes: int = 13, speed_factors: dict[str, float] | None = None, seed: int = 0,
                 name: str = "default", namespace: str = "default", placement: str = "load-balance",
                 placement_model: str | None = None, sensitivity_factors: dict[str, float] | None = None):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.speed_factors, self.seed = nodes, speed_factors, seed
        self.sensitivity_factors, self.epsilon = sensitivity_factors, epsilon
        self.name, self.namespace = name, namespace
        self.placement_name = placement
        self.placement = registry.make_placement(placement, registry.PolicyContext(model_path=placement_model))
        # A learned placement explores and records as the operator serves it (serving.serve).
        self.placement_learned = registry.is_learned("placement", placement)
        if policy == "dl2":
            self.actor = ExploringActor(load_model(model_path, "dl2", "allocation"), epsilon, self.rng)
            window = int(self.actor.model.card.encoder_params["window"])
            self.allocation = DL2Policy(self.actor, window=window, on_step=self.actor.on_step)
        else:
            self.actor, self.allocation = None, registry.make_allocation(policy)
        self.policy = policy

    def _decide(self, kind: str, snapshot, when: float, sink: list, interval: int) -> Decision:
        if self.actor is not None:
            self.actor.start(kind, rfc3339(when))
        placement, served = self.placement, None
        if self.placement_learned:
            served = serving.serve({"placement": self.placement}, namespace=self.namespace, policy=self.name,
                                   interval=interval, kind=kind, time=rfc3339(when), epsilon=self.epsilon,
                                   record=True)
            placement = served.phases["placement"]
        run = run_round if kind == "round" else run_admission
        decision = run(snapshot, self.allocation, placement)
        if self.actor is not None:
            done = self.actor.recorder.finish()
            if done is not None:
                sink.append(done)
        if served is not None:
            sink.extend(served.decisions())
        return decision

    def run_trace(self, trace, trace_seed: int, first_interval: int, offset_s: float,
                  max_slots: int = 400) -> Iterator[IntervalRecord]:
        config = SimConfig(nodes=self.nodes, seed=trace_seed, speed_factors=self.speed_factors,
                           sensitivity_factors=self.sensitivity_factors)
        sim = Simulator(trace, config)
        number = first_interval
        while not sim.done and sim.slot < max_slots:
            start = sim.time_s
            decisions: list = []
            snapshot = sim.snapshot()
            grants = {}
            decision = self._decide("round", snapshot, offset_s + start, decisions, number)
            grants.update(decision.jobs)

            def admit(snap):
                step = self._decide("admission", snap, offset_s + snap.time_s, decisions, number)
                grants.update(step.jobs)
                return step

            before = {s.spec.name: s.epochs_done for s in sim.active}
            seen = dict.fromkeys(before)
            reward = sim.advance(decision, admit)
            seen.update(dict.fromkeys(grants))
            jobs = [self._job(sim, name, grants.get(name), before.get(name, 0.0), trace_seed, offset_s, start)
                    for name in seen]
            self.end_s = offset_s + sim.time_s  # where the next trace may start, even if this one is cut short
            yield IntervalRecord(
                namespace=self.namespace, policy=self.name, policy_uid=f"uid-{self.name}", interval=number,
                start=rfc3339(offset_s + start), end=rfc3339(offset_s + start + config.interval_s),
                length_s=config.interval_s, algorithms={"allocation": self.policy, "placement": self.placement_name},
                nodes=self.nodes, reward=float(reward), jobs=jobs, decisions=decisions)
            number += 1

    def _job(self, sim, name, grant, at_start, trace_seed, offset_s, start) -> JobInterval:
        state = sim.states[name]
        spec = state.spec
        nodes = sim.node_names
        ps = [nodes[n] for n in grant.ps_nodes] if grant else []
        workers = [nodes[n] for n in grant.worker_nodes] if grant else []
        trained = state.epochs_done - at_start
        return JobInterval(
            name=f"{name}-{trace_seed}", uid=f"{trace_seed}-{name}", model_type=spec.model,
            architecture=ARCH[spec.arch], total_epochs=float(spec.epochs), created=rfc3339(offset_s + spec.arrival_s),
            ps=len(ps), workers=len(workers), placement={"ps": ps, "worker": workers},
            epochs_at_start=float(at_start), epochs=float(trained), reward=float(trained / spec.epochs),
            finished=bool(state.finish_s is not None and state.finish_s >= start))


def record_history(intervals: int, policy: str = "dl2", model_path: str | None = None,
                   epsilon: float = 0.1, nodes: int = 13, jobs: int = 60, rate: float = 3.0,
                   speed_factors: dict[str, float] | None = None, seed: int = 0,
                   first_interval: int = 1, progress: bool = False, placement: str = "load-balance",
                   placement_model: str | None = None,
                   sensitivity_factors: dict[str, float] | None = None) -> list[IntervalRecord]:
    """`intervals` records from traces of `jobs` jobs (seeds HISTORY_SEED_BASE + 1000·seed + k)
    run one after the other, as one cluster's history. With the `fixed` allocation the traces
    are issue 15's placement traces (users fix each job's counts; `jobs` and `rate` unused)."""
    rec = HistoryRecorder(policy, model_path, epsilon, nodes, speed_factors, seed,
                          placement=placement, placement_model=placement_model,
                          sensitivity_factors=sensitivity_factors)
    out: list[IntervalRecord] = []
    offset, k = 0.0, 0
    bar = tqdm(total=intervals, desc="recording", file=sys.stderr, disable=None if progress else True, leave=False)
    while len(out) < intervals:
        trace_seed = HISTORY_SEED_BASE + 1000 * seed + k
        trace = (scenarios.placement_trace(nodes, trace_seed) if policy == "fixed"
                 else generators.generate(jobs=jobs, rate=rate, seed=trace_seed))
        for record in rec.run_trace(trace, trace_seed, first_interval + len(out), offset):
            out.append(record)
            bar.update(1)
            if len(out) >= intervals:
                break
        offset = rec.end_s + 3600.0  # the next trace starts after a quiet hour
        k += 1
    bar.close()
    return out


def write_records(records: list[IntervalRecord], directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for r in records:
        (directory / f"{r.interval:08d}.json.gz").write_bytes(r.to_bytes())


def read_record_dir(directory: str | Path) -> list[IntervalRecord]:
    """What write_records wrote, or any directory of <interval>.json.gz records (a local
    stand-in for the operator's dataset: `mlsched retrain --records`, fidelity's runs)."""
    paths = sorted(Path(directory).glob("*.json.gz"))
    if not paths:
        raise ValueError(f"no interval records (*.json.gz) in {directory}")
    return [IntervalRecord.from_bytes(p.read_bytes()) for p in paths]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m policy_models.retrain.history", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--intervals", type=int, default=200)
    p.add_argument("--policy", default="dl2", help="dl2 (recorded decisions), a heuristic (drf, ...), or fixed "
                                                   "(placement traces: the users fix the counts)")
    p.add_argument("--placement", default="load-balance", help="the placement policy (e.g. harmony)")
    p.add_argument("--model", help="ONNX model for dl2 (default: the shipped one)")
    p.add_argument("--epsilon", type=float, default=0.1)
    p.add_argument("--nodes", type=int, default=13)
    p.add_argument("--jobs", type=int, default=60, help="jobs per trace")
    p.add_argument("--rate", type=float, default=3.0)
    p.add_argument("--speed-perturbation", type=float, default=0.0,
                   help="per-model speed factors uniform in [1-x, 1+x] (0: the catalog's speeds)")
    p.add_argument("--sensitivity-perturbation", type=float, default=0.0,
                   help="per-model interference sensitivity factors log-uniform in [1/(1+x), 1+x] (0: the table's)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    factors = perturbation(a.speed_perturbation, a.seed) if a.speed_perturbation > 0 else None
    sensitivity = (sensitivity_perturbation(a.sensitivity_perturbation, a.seed)
                   if a.sensitivity_perturbation > 0 else None)
    records = record_history(a.intervals, a.policy, a.model, a.epsilon, a.nodes, a.jobs, a.rate, factors,
                             a.seed, progress=True, placement=a.placement, sensitivity_factors=sensitivity)
    out = Path(a.out)
    write_records(records, out)
    (out / "perturbation.json").write_text(json.dumps({"speed_factors": factors or {},
                                                       "sensitivity_factors": sensitivity or {}}, indent=1))
    print(f"wrote {len(records)} interval records to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
