"""Train DL² in the simulator: supervised warm-up on DRF, then actor-critic RL. One file, the
loop in plain sight (CleanRL style); hyperparameters in the dataclass below.

    mlsched train dl2 [--time-budget-min 28] [--out policy_models/artifacts/dl2]

writes <out>/dl2.onnx (+ card), <out>/dl2-sl.onnx (SL only, + card) and <out>/learning-curve.png.

Training traces come from the benchmark generator with seeds from `train_seed_base` upward,
validation traces from `val_seed_base`; the benchmarks use workloads.scenarios.BENCHMARK_SEEDS,
which neither touches.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from mlsched.features import dl2_state
from mlsched.policies import registry
from mlsched.policies.round import run_admission, run_round
from mlsched.policies.allocation.dl2 import DL2Policy
from mlsched.sim.simulator import SimConfig, Simulator
from mlsched.workloads import catalog, generators, gpu_types
from mlsched.sim.scenarios import BENCHMARK_SEEDS, SCENARIOS
from policy_models import domain
from policy_models.dl2 import export, networks
from policy_models.domain import DL2_JOBS_PER_EPISODE
from policy_models.options import parse_into


@dataclass
class Args:
    out: str = "policy_models/artifacts/dl2"
    seed: int = 1
    window: int = 40
    arch: str = "shared"  # shared | flat (the paper's)
    hidden: tuple[int, ...] = (64, 64)  # one inference at J = 40: 19 µs (32), 23 (64), 37 (128); docs/dl2.md
    # workloads
    train_seed_base: int = 1_000
    val_seed_base: int = 50_000
    val_traces: int = 1  # per validation scenario
    val_scenarios: tuple[str, ...] = ("small", "medium", "large")
    train_nodes: tuple[int, ...] = (13, 30, 60, 200, 500)
    # model types kept out of training and validation traces (the generalisation experiment:
    # the policy sees jobs only through model-agnostic features, so it should schedule these)
    holdout_models: tuple[str, ...] = ()
    # supervised warm-up (DL² §3: DRF as teacher, cross-entropy)
    # drf (the paper's) | optimus-oracle | relative-oracle | ridge-oracle (the oracles are
    # privileged: true speeds, training only; docs/dl2.md)
    teacher: str = "relative-oracle"
    sl_traces: int = 60
    sl_epochs: int = 20
    sl_lr: float = 1e-3
    sl_batch: int = 256
    dagger_rounds: int = 4  # DAgger rounds after plain imitation (0: the paper's warm-up only)
    dagger_traces: int = 20  # student rollouts per round, labelled by the teacher
    dagger_epochs: int = 8
    # reinforcement learning (actor-critic, entropy, job-aware exploration, replay)
    rl_episodes: int = 100_000  # the time budget usually ends training first
    rl_lr: float = 3e-5  # 1e-4 drifted away from the warm-up within 100 episodes
    gamma: float = 0.9  # per slot
    gae_lambda: float = 0.95
    entropy_start: float = 0.005
    entropy_end: float = 0.001
    explore_start: float = 0.05  # probability of a job-aware exploration step
    explore_end: float = 0.0
    random_start: float = 0.05  # probability of a uniformly random allowed action (stop included)
    random_end: float = 0.0
    ratio_threshold: float = 10.0  # "poor state": one role over 10x the other
    replay: int = 8192
    batch: int = 256
    updates_per_episode: int = 8
    max_slots_per_episode: int = 40
    validate_every: int = 25
    time_budget_min: float = 28.0
    anneal_episodes: int = 600
    critic_warmup_episodes: int = 40  # fit the value network before the policy moves
    init_sl: str = ""  # a dl2-sl.pt from an earlier run: skip the supervised phase
    # As the operator admits: 'arrival' adds admission steps (waiting jobs only, running ones
    # held) at arrivals and completions between rounds, and the network decides those too.
    admission: str = "arrival"
    # GPU types (issue 54): "v100,p100,k80" trains on clusters whose nodes are split evenly
    # among these types (training and validation), placed by gpu-type-aware, with the state's
    # GPU-type columns; "" (the default) is the untyped cluster of every model before types.
    gpu_types: str = ""


VALIDATION_MAX_SLOTS = 3000


# ---- actors -----------------------------------------------------------------------------------
class DRFTeacher:
    """DRF expressed as DL² actions: a bundle for the windowed job with the smallest dominant
    share granted so far (ties: arrival order), stop when no bundle fits."""

    def act(self, state, mask):
        rows = state.vector[: state.window * dl2_state.job_features(state.typed)].reshape(state.window, -1)
        best, best_share = state.void, np.inf
        for i in range(len(state.jobs)):
            a = 3 * i + dl2_state.BUNDLE
            if mask[a] and rows[i, dl2_state._SHARE] < best_share - 1e-12:
                best, best_share = a, rows[i, dl2_state._SHARE]
        return best


class OptimusOracleTeacher:
    """Optimus with the simulator's true speed function, expressed as DL² actions: start every
    windowed job that holds nothing (arrival order), then grant the task with the largest
    gain per dominant-resource share, and stop when no task shortens any job. A privileged
    teacher: it needs the speed function only during training, the network it teaches sees
    only the state.

    `relative`: the gain is the drop in remaining time as a fraction of the job's remaining
    time (1 - speed before / speed after), not in seconds: Optimus's absolute gain grows with
    the work left, so it hands tasks to the longest jobs, the opposite of what average JCT
    wants; the relative gain is the speed-up per resource, whatever the job's length
    (validation traces: 0.73 x DRF at 13 nodes where Optimus-oracle gives 0.80). `reserve`: while jobs of later windows still wait to start, a
    window only grows its jobs into capacity their starting gangs do not need (windows of J
    would otherwise let the first 40 jobs take everything).

    `ridge` (0: off): when no single task shortens any windowed job, the first task of the
    best bundle of 2 to `ridge` tasks of one job (relative gain per dominant share), as long
    as the cluster keeps `headroom` of every resource free and `empty_nodes` nodes with
    nothing on them per task of the bundle (tasks that share nodes pay interference). Optimus's one-task search stops
    on ridges of the measured speed table (ResNet-50 at (5, 2) runs at 0.745 of its best rate,
    docs/dl2.md "Where that room is"); past them, capacity nobody else asked for speeds jobs
    up. Only once every single task is refused, so it never takes what a job's next task
    would have had."""

    def __init__(self, relative: bool = False, reserve: bool = False, ridge: int = 0,
                 headroom: float = 0.0, empty_nodes: float = 0.0):
        from mlsched.policies.allocation.optimus import Optimus
        from mlsched.policies.speed_estimate import TrueSpeed
        from mlsched.workloads.speed_models import MeasuredSpeed

        self.estimator = TrueSpeed(MeasuredSpeed())
        self.optimus = Optimus(lambda snapshot: self.estimator)
        self.relative, self.reserve = relative, reserve
        self.ridge, self.headroom, self.empty_nodes = ridge, headroom, empty_nodes

    def _gain(self, job, ledger, total):
        gain, role = self.optimus.best_gain(job, ledger, self.estimator, total)
        if self.relative and np.isfinite(gain):
            now = self.optimus._time(job, self.estimator, ledger.count(job, "ps"), ledger.count(job, "worker"))
            gain = gain / now if np.isfinite(now) and now > 0 else gain
        return gain, role

    def _reserved(self, state) -> np.ndarray:
        """Summed starting-gang demand of the later windows' jobs that hold nothing yet."""
        ledger, mine = state.ledger, {id(j) for j in state.jobs}
        out = np.zeros(3)
        for job in state.snapshot.jobs:
            if id(job) in mine or ledger.has_tasks(job):
                continue
            ps = max(job.min_ps, 1) if job.uses_ps else 0
            out += max(job.min_workers, 1) * ledger.demand(job, "worker")
            if ps:
                out += ps * ledger.demand(job, "ps")
        return out

    def act(self, state, mask):
        ledger = state.ledger
        for i, job in enumerate(state.jobs):
            if not ledger.has_tasks(job):
                if mask[3 * i + dl2_state.BUNDLE]:
                    return 3 * i + dl2_state.BUNDLE
        total = np.where(state.snapshot.total_capacity > 0, state.snapshot.total_capacity, 1.0)
        spare = ledger.free.sum(axis=0) - self._reserved(state) if self.reserve and state.vector[-1] > 0 else None  # last global: backlog
        best, best_gain = state.void, 0.0
        for i, job in enumerate(state.jobs):
            if not ledger.has_tasks(job):
                continue
            gain, role = self._gain(job, ledger, total)
            a = 3 * i + (dl2_state.PS if role == "ps" else dl2_state.WORKER)
            if spare is not None and (spare < ledger.demand(job, role) - 1e-9).any():
                continue
            if gain > best_gain and mask[a]:
                best, best_gain = a, gain
        if best == state.void and self.ridge > 1:
            return self._past_a_ridge(state, mask, total)
        return best

    def _past_a_ridge(self, state, mask, total) -> int:
        """The first task of the bundle (2 to `ridge` tasks of one job, within its bounds and
        the headroom) that shortens its job most per dominant share; void if none does."""
        ledger, time = state.ledger, self.optimus._time
        free = ledger.free.sum(axis=0) / total
        empty = int((np.abs(ledger.free - state.snapshot.capacity) < 1e-9).all(axis=1).sum())
        best, best_gain = state.void, 0.0
        for i, job in enumerate(state.jobs):
            if not ledger.has_tasks(job):
                continue
            ps, w = ledger.count(job, "ps"), ledger.count(job, "worker")
            now = time(job, self.estimator, ps, w)
            if not np.isfinite(now) or now <= 0:
                continue
            worker_share = ledger.demand(job, "worker") / total
            ps_share = ledger.demand(job, "ps") / total if job.uses_ps else np.zeros_like(worker_share)
            max_ps = job.bounds("ps")[1] if job.uses_ps else 0
            max_w = job.bounds("worker")[1]
            grow_w, grow_ps = 3 * i + dl2_state.WORKER, 3 * i + dl2_state.PS
            for more_ps in range(min(self.ridge, max_ps - ps) + 1):
                for more_w in range(max(2 - more_ps, 0), min(self.ridge - more_ps, max_w - w) + 1):
                    # its first task: a worker if it has one and one fits, else a PS
                    first = grow_w if more_w and mask[grow_w] else grow_ps if more_ps and mask[grow_ps] else None
                    share = more_ps * ps_share + more_w * worker_share
                    if first is None or (free - share).min() < self.headroom \
                            or empty < self.empty_nodes * (more_ps + more_w):
                        continue
                    after = time(job, self.estimator, ps + more_ps, w + more_w)
                    if not np.isfinite(after) or after >= now:
                        continue
                    gain = (now - after) / (now if self.relative else 1.0) / max(float(share.max()), 1e-9)
                    if gain > best_gain:
                        best, best_gain = first, gain
        return best


TEACHERS = {
    "drf": DRFTeacher,
    "optimus-oracle": OptimusOracleTeacher,
    "relative-oracle": lambda: OptimusOracleTeacher(relative=True, reserve=True),
    # Bundles of up to 5 tasks past a ridge, while 8 empty nodes per task are left: picked on
    # training seeds 7000-7004 at 13-500 nodes (docs/dl2.md "Past the ridges").
    "ridge-oracle": lambda: OptimusOracleTeacher(relative=True, reserve=True, ridge=5, empty_nodes=8),
}


class SamplingActor:
    """Samples the policy; with probability `explore`, in a poor state (one role over
    `ratio` times the other) it adds the scarcer task instead (DL²'s job-aware exploration);
    with probability `random` it takes any allowed action uniformly (so stopping early, which
    DRF never shows, gets tried)."""

    def __init__(self, policy: networks.NumpyPolicy, rng: np.random.Generator, explore: float, ratio: float,
                 random: float = 0.0):
        self.policy, self.rng, self.explore, self.ratio, self.random = policy, rng, explore, ratio, random
        self.last_prob = 1.0

    def act(self, state, mask):
        probs = self.policy.probabilities(state.vector, mask)
        a = int(self.rng.choice(len(probs), p=probs))
        self.last_prob = float(probs[a])
        if self.random > 0 and self.rng.random() < self.random:
            allowed = np.flatnonzero(mask)
            a = int(self.rng.choice(allowed))
            self.last_prob = 1.0 / len(allowed)
            return a
        if self.explore > 0 and self.rng.random() < self.explore:
            for i, job in enumerate(state.jobs):
                if not job.uses_ps or not state.ledger.has_tasks(job):
                    continue
                w, u = state.ledger.count(job, "worker"), state.ledger.count(job, "ps")
                want = dl2_state.PS if w > self.ratio * u else dl2_state.WORKER if u > self.ratio * w else None
                if want is not None and mask[3 * i + want]:
                    a = 3 * i + want
                    self.last_prob = 1.0  # not the policy's choice: down-weighted in updates
                    break
        return a


class GreedyActor:
    def __init__(self, policy: networks.NumpyPolicy):
        self.policy = policy

    def act(self, state, mask):
        return int(np.argmax(np.where(mask, self.policy.logits(state.vector), -np.inf)))


# ---- workloads --------------------------------------------------------------------------------
def train_episode_setup(args: Args, k: int):
    rng = np.random.default_rng(args.train_seed_base + k)
    nodes = int(rng.choice(args.train_nodes))
    rate = 3.0 * nodes / 13 * rng.uniform(0.6, 1.4)
    jobs = int(rng.integers(DL2_JOBS_PER_EPISODE[0], DL2_JOBS_PER_EPISODE[1] + 1))
    seed = args.train_seed_base + k
    assert seed not in BENCHMARK_SEEDS
    trace = generators.generate(jobs=jobs, rate=rate, seed=seed, models=training_models(args))
    return trace, SimConfig(nodes=nodes, seed=seed, admission=args.admission,
                            gpu_types=typed_cluster(args, nodes))


def cluster_types(args: Args) -> tuple[str, ...]:
    """The GPU types training splits its clusters among (none: untyped)."""
    if not args.gpu_types:
        return ()
    return tuple(gpu_types.canonical_type(t.strip()) for t in args.gpu_types.split(",") if t.strip())


def typed_cluster(args: Args, nodes: int) -> tuple[str, ...] | None:
    """One GPU type per node, the nodes split evenly among --gpu-types in order (the first
    types take the remainder); None for an untyped cluster."""
    types = cluster_types(args)
    if not types:
        return None
    return tuple(types[min(n * len(types) // nodes, len(types) - 1)] for n in range(nodes))


def training_models(args: Args) -> tuple[str, ...] | None:
    if not args.holdout_models:
        return None
    held = {catalog.canonical_name(m) for m in args.holdout_models}
    kept = tuple(m for m in catalog.MODEL_NAMES if m not in held)
    if not kept:
        raise SystemExit("--holdout-models leaves no model to train on")
    return kept


def validation_sets(args: Args):
    out = []
    for name in args.val_scenarios:
        sc = SCENARIOS[name]
        for k in range(args.val_traces):
            seed = args.val_seed_base + k
            config = sc.config(seed, admission=args.admission)
            config = dataclasses.replace(config, gpu_types=typed_cluster(args, config.nodes))
            out.append((name, sc.trace(seed, training_models(args)), config))
    return out


def simulate(trace, config, allocation, on_slot=None, max_slots=None):
    sim = Simulator(trace, config)
    # A typed cluster is placed as a heterogeneity-aware allocation is served: by GPU type.
    lb = registry.make_placement("gpu-type-aware" if config.gpu_types else "load-balance")
    # The same admission steps Simulator.run takes (and the operator), or none.
    admit = ((lambda snapshot: run_admission(snapshot, allocation, lb))
             if config.admission == "arrival" else None)
    while not sim.done and (max_slots is None or sim.slot < max_slots):
        reward = sim.advance(run_round(sim.snapshot(), allocation, lb), admit)
        if on_slot:
            on_slot(reward)
    return sim.result()


def avg_jct(result) -> float:
    return result.summary()["avg_jct_s"]


# ---- supervised warm-up -----------------------------------------------------------------------
class LabelledByTeacher:
    """DAgger: the student acts (greedily), the teacher says what it would have done in the
    student's state; the labels are recorded, the student's action is taken. Plain imitation
    only ever sees the teacher's own states, so the student's first mistake leads it where
    it never learned what to do."""

    def __init__(self, student, teacher):
        self.student, self.teacher, self.label = student, teacher, None

    def act(self, state, mask):
        self.label = self.teacher.act(state, mask)
        return self.student.act(state, mask)


def make_teacher(args: Args):
    if args.teacher not in TEACHERS:
        raise ValueError(f"unknown teacher {args.teacher!r}; choose one of {', '.join(TEACHERS)}")
    return TEACHERS[args.teacher]()


def collect_teacher_samples(args: Args, traces: range, student=None):
    """(state, mask, teacher's action) for every step of rollouts on `traces`: driven by the
    teacher itself, or by `student` (a network) with the teacher's labels (DAgger)."""
    states, masks, actions = [], [], []
    teacher = make_teacher(args)
    actor = teacher if student is None else LabelledByTeacher(GreedyActor(networks.NumpyPolicy(student)), teacher)

    def record(vec, mask, action, granted):
        states.append(vec)
        masks.append(mask)
        actions.append(action if student is None else actor.label)

    policy = DL2Policy(actor, window=args.window, on_step=record, typed=bool(cluster_types(args)))
    for k in traces:
        trace, config = train_episode_setup(args, k)
        simulate(trace, config, policy, max_slots=args.max_slots_per_episode)
    return (torch.tensor(np.array(states)), torch.tensor(np.array(masks), dtype=torch.float32),
            torch.tensor(actions))


def agreement(net, states, masks, actions) -> float:
    with torch.no_grad():
        pred = networks.masked_logits(net.logits(states), masks).argmax(dim=-1)
    return float((pred == actions).float().mean())


def fit(net, opt, s, m, a, epochs: int, batch: int, desc: str) -> None:
    n = len(a)
    for _ in tqdm(range(epochs), desc=desc, file=sys.stderr, disable=None, leave=False):
        perm = torch.randperm(n)
        for k in range(0, n, batch):
            idx = perm[k:k + batch]
            loss = torch.nn.functional.cross_entropy(networks.masked_logits(net.logits(s[idx]), m[idx]), a[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()


def supervised(args: Args, net, log):
    """Imitate the teacher (cross-entropy), then `dagger_rounds` of DAgger: roll the student
    out on fresh traces, label its states with the teacher's actions, refit on everything."""
    s, m, a = collect_teacher_samples(args, range(args.sl_traces))
    hs, hm, ha = collect_teacher_samples(args, range(10_000, 10_004))  # held out
    opt = torch.optim.Adam(net.parameters(), lr=args.sl_lr)
    fit(net, opt, s, m, a, args.sl_epochs, args.sl_batch, "SL warm-up")
    result = {"teacher_samples": len(a)}
    first = args.sl_traces
    for r in range(args.dagger_rounds):
        traces = range(first, first + args.dagger_traces)
        first += args.dagger_traces
        ds, dm, da = collect_teacher_samples(args, traces, student=net)
        result.setdefault("dagger_agreement_before_refit", []).append(agreement(net, ds, dm, da))
        s, m, a = torch.cat([s, ds]), torch.cat([m, dm]), torch.cat([a, da])
        fit(net, opt, s, m, a, args.dagger_epochs, args.sl_batch, f"DAgger {r + 1}/{args.dagger_rounds}")
    result.update(samples=len(a), train_agreement=agreement(net, s, m, a),
                  heldout_agreement=agreement(net, hs, hm, ha))
    log(f"SL: {len(a)} samples ({result['teacher_samples']} from the teacher, the rest DAgger), "
        f"agreement with {args.teacher} train {result['train_agreement']:.3f} "
        f"held-out {result['heldout_agreement']:.3f}")
    return result


# ---- reinforcement learning -------------------------------------------------------------------
def rl_episode(args, k, net, rng, explore, random=0.0, setup=None):
    """Roll out one training trace with the sampling policy. `setup(args, k)` gives the trace and
    the simulator's config (default: train_episode_setup; retraining passes a calibrated one).

    Credit assignment: every inference is a step; a slot's reward arrives at its last step;
    the discount is 1 between the steps of one slot and γ from one slot to the next. The
    critic estimates the discounted reward-to-go from each step's state, and advantages are
    generalised advantage estimates over that step sequence, so an action is judged by how it
    changed the critic's expectation rather than by the whole slot's noisy reward alone.
    Returns (state, mask, action, value target, advantage, behaviour probability) tuples.
    """
    actor = SamplingActor(networks.NumpyPolicy(net), rng, explore, args.ratio_threshold, random)
    steps: list[tuple] = []
    reward = []  # per step
    discount = []  # from this step to the next
    pending = [0.0, 1.0]  # reward of step-less slots, carried back to the last step, and its discount

    def record(vec, mask, action, granted):
        steps.append((vec, mask, action, actor.last_prob))
        reward.append(0.0)
        discount.append(1.0)

    def on_slot(r):
        if not steps:
            return
        if len(steps) == pending_len[0]:  # no inference this slot: fold its reward back
            pending[1] *= args.gamma
            reward[-1] += pending[1] * r
            return
        reward[-1] += r
        discount[-1] = args.gamma
        pending[1] = 1.0
        pending_len[0] = len(steps)

    pending_len = [0]
    policy = DL2Policy(actor, window=args.window, on_step=record, typed=bool(cluster_types(args)))
    trace, config = (setup or train_episode_setup)(args, k)
    simulate(trace, config, policy, on_slot=on_slot, max_slots=args.max_slots_per_episode)
    if not steps:
        return [], 0.0
    states = np.array([st[0] for st in steps])
    targets, adv = gae(net, states, np.array(reward, np.float32), np.array(discount, np.float32), args.gae_lambda)
    out = [(vec, mask, a, targets[i], adv[i], mu) for i, (vec, mask, a, mu) in enumerate(steps)]
    return out, float(np.sum(reward))


def gae(net, states: np.ndarray, reward: np.ndarray, discount: np.ndarray, lam: float,
        batch: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Value targets and generalised advantage estimates over one sequence of steps:
    `reward[i]` arrives after step i, `discount[i]` links step i to step i + 1 (1 inside a
    slot, γ between slots, 0 where the sequence breaks). Also used on recorded histories."""
    with torch.no_grad():
        values = np.concatenate([net.value(torch.from_numpy(states[k:k + batch].astype(np.float32))).numpy()
                                 for k in range(0, len(states), batch)])
    adv = np.zeros(len(states), np.float32)
    nxt_adv, nxt_value = 0.0, 0.0
    for i in reversed(range(len(states))):
        delta = reward[i] + discount[i] * nxt_value - values[i]
        nxt_adv = delta + discount[i] * lam * nxt_adv
        adv[i] = nxt_adv
        nxt_value = values[i]
    return adv + values, adv


class Replay:
    """The most recent `capacity` steps (DL² keeps 8192); minibatches are drawn uniformly."""

    def __init__(self, capacity: int, state_dim: int, n_actions: int):
        self.s = np.zeros((capacity, state_dim), np.float32)
        self.m = np.zeros((capacity, n_actions), np.float32)
        self.a = np.zeros(capacity, np.int64)
        self.g = np.zeros(capacity, np.float32)
        self.adv = np.zeros(capacity, np.float32)
        self.mu = np.zeros(capacity, np.float32)
        self.size, self.pos, self.cap = 0, 0, capacity

    def add(self, s, m, a, g, adv, mu):
        i = self.pos
        self.s[i], self.m[i], self.a[i], self.g[i], self.adv[i], self.mu[i] = s, m, a, g, adv, mu
        self.pos = (i + 1) % self.cap
        self.size = min(self.size + 1, self.cap)

    def sample(self, rng, n):
        idx = rng.integers(0, self.size, min(n, self.size))
        return tuple(torch.from_numpy(x[idx]) for x in (self.s, self.m, self.a, self.g, self.adv, self.mu))


def rl_update(net, opt, batch, beta, clip=0.2, policy_weight=1.0, weight=None):
    """Actor-critic step on replayed samples: the policy term is clipped in the ratio of new to
    behaviour probability (so stale samples cannot drag the policy far), plus value
    regression and an entropy bonus.

    `weight` (per sample, no gradient): off-policy fine-tuning on recorded decisions
    (policy_models/retrain/offpolicy.py) passes the network's probability before fine-tuning
    as `mu` (the ratio's base, so the clip is a trust region around where it started) and the
    truncated importance weight of that over the serving policy's probability here."""
    s, m, a, g, adv, mu = batch
    logits = networks.masked_logits(net.logits(s), m)
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(1, a[:, None]).squeeze(1)
    probs = logp_all.exp()
    entropy = -(probs * torch.where(m > 0, logp_all, torch.zeros_like(logp_all))).sum(-1).mean()
    v = net.value(s)
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    ratio = torch.exp(logp - torch.log(mu.clamp(min=1e-6)))
    surrogate = torch.min(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv)
    policy_loss = -(surrogate if weight is None else weight * surrogate).mean()
    # With policy_weight 0 only the critic learns: advantages from an untrained critic would
    # otherwise push the warm-started policy around at random.
    loss = policy_weight * (policy_loss - beta * entropy) + 0.5 * torch.nn.functional.mse_loss(v, g)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    opt.step()
    return float(loss.detach()), float(entropy.detach())


def validate(args, net, val_sets) -> dict[str, float]:
    actor = GreedyActor(networks.NumpyPolicy(net))
    policy = DL2Policy(actor, window=args.window, typed=bool(cluster_types(args)))
    per: dict[str, list[float]] = {}
    for name, trace, config in val_sets:
        result = simulate(trace, config, policy, max_slots=VALIDATION_MAX_SLOTS)
        # A policy that leaves jobs unfinished is not better for having fewer JCTs to average.
        per.setdefault(name, []).append(avg_jct(result) if result.completed == result.jobs else float("inf"))
    return {name: float(np.mean(v)) for name, v in per.items()}


def baselines(args, val_sets) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for policy in ("drf", "optimus"):
        per: dict[str, list[float]] = {}
        for name, trace, config in val_sets:
            per.setdefault(name, []).append(avg_jct(simulate(trace, config, registry.make_allocation(policy))))
        out[policy] = {name: float(np.mean(v)) for name, v in per.items()}
    return out


def score(val: dict[str, float], base: dict[str, dict[str, float]]) -> float:
    """Mean avg-JCT ratio to DRF over validation scenarios (lower is better)."""
    return float(np.mean([val[n] / base["drf"][n] for n in val]))


# ---- main ---------------------------------------------------------------------------------------
def train(args: Args, log=print, argv: list[str] | None = None) -> dict:
    """`argv`: the trainer's own arguments, recorded in the card as the command to rerun."""
    t0 = time.time()
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    typed = bool(cluster_types(args))
    net = networks.build(args.arch, args.window, tuple(args.hidden), typed)
    val_sets = validation_sets(args)
    base = baselines(args, val_sets)
    log("validation baselines (avg JCT, s): " + json.dumps(base))

    if args.init_sl:
        net.load_state_dict(torch.load(args.init_sl))
        sl = {"loaded_from": args.init_sl}
    else:
        sl = supervised(args, net, log)
        torch.save(net.state_dict(), out / "dl2-sl.pt")  # resumable with --init-sl (not shipped)
    sl_val = validate(args, net, val_sets)
    sl["validation_avg_jct_s"] = sl_val
    sl["validation_ratio_to_drf"] = score(sl_val, base)
    log(f"SL only: validation {json.dumps(sl_val)}, ratio to DRF {sl['validation_ratio_to_drf']:.3f}")
    sl_card = export.export(net, args, out / "dl2-sl.onnx", phase="sl", training={"sl": sl},
                            validation={"avg_jct_s": sl_val, "baselines": base},
                            domain=domain.dl2(dataclasses.asdict(args)))

    best = {"score": sl["validation_ratio_to_drf"], "state": {k: v.clone() for k, v in net.state_dict().items()},
            "episode": 0, "val": sl_val}
    curve = [(0, sl_val)]
    replay = Replay(args.replay, dl2_state.state_dim(args.window, typed), dl2_state.n_actions(args.window))
    opt = torch.optim.Adam(net.parameters(), lr=args.rl_lr)
    budget = args.time_budget_min * 60
    episodes = 0
    bar = tqdm(total=args.rl_episodes, desc="RL", file=sys.stderr, disable=None)
    for ep in range(1, args.rl_episodes + 1):
        if time.time() - t0 > budget:
            break
        frac = min(ep / args.anneal_episodes, 1.0)
        explore = args.explore_start + frac * (args.explore_end - args.explore_start)
        beta = args.entropy_start + frac * (args.entropy_end - args.entropy_start)
        random = args.random_start + frac * (args.random_end - args.random_start)
        samples, ep_reward = rl_episode(args, args.sl_traces + args.dagger_rounds * args.dagger_traces + ep, net, rng, explore, random)
        for smp in samples:
            replay.add(*smp)
        warm = ep <= args.critic_warmup_episodes
        for _ in range(args.updates_per_episode if replay.size else 0):  # an episode may decide nothing
            rl_update(net, opt, replay.sample(rng, args.batch), beta, policy_weight=0.0 if warm else 1.0)
        episodes = ep
        bar.update(1)
        if ep % args.validate_every == 0:
            val = validate(args, net, val_sets)
            curve.append((ep, val))
            sc = score(val, base)
            bar.set_postfix(val_vs_drf=f"{sc:.3f}", best=f"{best['score']:.3f}")
            log(f"RL episode {ep} ({(time.time() - t0) / 60:.1f} min): validation vs DRF {sc:.3f} "
                f"{json.dumps({k: round(v) for k, v in val.items()})}, best {min(sc, best['score']):.3f}")
            if sc < best["score"]:
                best = {"score": sc, "state": {k: v.clone() for k, v in net.state_dict().items()},
                        "episode": ep, "val": val}
    bar.close()
    net.load_state_dict(best["state"])
    wall = time.time() - t0
    training = {
        "command": " ".join(["mlsched train dl2", *(sys.argv[1:] if argv is None else argv)]),
        "wall_time_s": round(wall, 1), "machine": f"{torch.get_num_threads()} torch thread(s), CPU",
        "args": {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(args).items()},
        "sl": sl, "rl": {"episodes": episodes, "best_episode": best["episode"]},
    }
    validation = {"avg_jct_s": best["val"], "ratio_to_drf": best["score"], "baselines": base}
    card = export.export(net, args, out / "dl2.onnx", phase="sl+rl", training=training, validation=validation,
                         domain=domain.dl2(training["args"]))
    export.plot_curve(curve, base, out / "learning-curve.png")
    log(f"best validation ratio to DRF {best['score']:.3f} at RL episode {best['episode']} of {episodes}; "
        f"wall time {wall / 60:.1f} min; wrote {out / 'dl2.onnx'}")
    return {"card": card, "sl_card": sl_card, "curve": curve}


def parse_args(argv: list[str] | None) -> Args:
    return parse_into(Args, argv, "mlsched train dl2", __doc__)


def main(argv: list[str] | None = None) -> int:
    train(parse_args(argv), argv=argv)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
