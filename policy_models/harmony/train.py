"""Train Harmony placement in the simulator: imitation of LIF, then actor-critic (§V-B).
One file, the loop in plain sight; hyperparameters in the dataclass below.

    mlsched train harmony [--time-budget-min 25] [--out policy_models/artifacts/harmony]

Setting: issue 15's (sim/scenarios.py `placement_trace`): the `fixed` allocation, mixed
parameter-server / all-reduce jobs, clusters of `train_nodes` nodes (one size drawn per
episode), interference on. Running jobs keep their nodes (Sticky); the network places new
tasks.

1. Warm start (our addition; the paper starts from scratch with 20 workers and a testbed):
   DAgger on the strongest heuristic here, LIF-Line. Each round rolls out a mixture (the
   teacher's choice with probability β, else the network's), labels every visited state with
   the teacher's node, and fits the network to all labels so far by cross-entropy.
2. Actor-critic, as the paper: each episode samples from the policy; with probability ε a
   decision keeps the task (the type is given here) and takes its node from bin-pack or
   load-balance (job-aware exploration); every decision of interval t gets the interval's
   return G_t = Σ_k γ^k r_{t+k}, with r = Σ_n c_n / e_n (Eq. 1, from the simulator); samples
   go to a FIFO replay (8192), and each episode is followed by minibatch updates of
   −log π(a|s)·(G − V(s)) − β·H(π(s)) + (G − V(s))², ε and β annealed linearly.
Every `validate_every` episodes (and after the warm start) the greedy policy runs on the
validation traces; the network with the lowest average JCT over LIF-Line's (same traces) is
exported. Writes <out>/harmony.onnx (+ card), <out>/learning-curve.{png,json}, and the torch
states <out>/imitation.pt and <out>/harmony.pt (for --init; not shipped).

`--environment reward-model --reward-model R.pt --train-nodes 6` runs the actor-critic
episodes on the reward model instead of the simulator (the paper's offline training;
docs/placement.md compares the two).

Seeds: training traces from `train_seed_base`, validation from `val_seed_base`; the
benchmark's (bench/bench_placement.py, 700000+) are neither.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import JobView, Role
from mlsched.features import harmony_state
from mlsched.policies import registry
from mlsched.policies.base import TaskByTaskPlacement
from mlsched.policies.placement.heuristics import BinPack, LoadBalance
from mlsched.policies.placement.interference_aware import LeastInterferenceFirst
from mlsched.policies.placement.sticky import Sticky
from mlsched.policies.round import run_admission, run_round
from mlsched.sim import scenarios
from mlsched.sim.simulator import SimConfig, Simulator
from policy_models import domain
from policy_models.harmony import export, networks, reward_model
from policy_models.options import parse_into


@dataclass
class Args:
    out: str = "policy_models/artifacts/harmony"
    seed: int = 1
    d: int = 32  # x 2 layers: a 110 KB graph, under kubectl apply's 256 KiB annotation as base64
    heads: int = 4
    layers: int = 2
    # Who decides the counts: `fixed` (the user's, issue 15's setting) and/or `dl2` (the shipped
    # model); one is drawn per episode, and validation averages over all of them.
    allocations: tuple[str, ...] = ("fixed",)
    train_nodes: tuple[int, ...] = (6, 12, 30)
    val_nodes: tuple[int, ...] = (6, 30)
    val_traces: int = 3
    train_seed_base: int = 300000
    val_seed_base: int = 400000
    dagger_rounds: int = 3
    dagger_episodes: int = 4  # per round
    bc_epochs: int = 3  # passes over all labels so far, per round
    ac_episodes: int = 200
    lr: float = 3e-4  # imitation
    ac_lr: float = 1e-4  # the paper's
    batch: int = 32  # the paper's minibatch
    updates_per_episode: int = 16
    replay: int = 8192  # the paper's FIFO replay
    gamma: float = 0.9  # per interval
    epsilon: tuple[float, ...] = (0.2, 0.0)  # start, end (linear over the AC episodes)
    entropy: tuple[float, ...] = (0.05, 0.0)
    value_coef: float = 0.5
    validate_every: int = 20
    time_budget_min: float = 0.0  # > 0: stop actor-critic when the budget is spent
    init: str = ""  # start from this torch state (<out>/imitation.pt of an earlier run)
    # Where actor-critic episodes run: the simulator, or the reward model (reward_model.py,
    # the paper's offline environment; its node count only). Validation always uses the simulator.
    environment: str = "simulator"
    reward_model: str = ""  # the reward model's .pt, for --environment reward-model
    # Ablations (docs/placement.md, the paper's Table/Fig. of its components): `--no-critic`
    # trains the actor on G minus the minibatch's mean G (REINFORCE with a constant baseline)
    # and no value loss; `--replay 0` learns from the episode just played only (on-policy, no
    # FIFO replay); `--epsilon 0 0` explores by the policy's own sampling only; `--layers 0`
    # has no attention over the jobs (each job's embedding alone forms the query).
    critic: bool = True


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---- acting in the simulator ---------------------------------------------------------------
class Sample:
    __slots__ = ("feeds", "action", "label", "interval", "ret")

    def __init__(self, feeds, action, label=-1, interval=0):
        self.feeds, self.action, self.label, self.interval, self.ret = feeds, action, label, interval, 0.0


class Learner(TaskByTaskPlacement):
    """The network as a per-task rule, in one of three modes: 'greedy' (what ships), 'dagger'
    (label with the teacher, act as the teacher with probability beta), 'explore' (sample,
    with epsilon a node from bin-pack or load-balance)."""

    name = "harmony-train"

    def __init__(self, net: networks.HarmonyNet, mode: str, rng: np.random.Generator,
                 beta: float = 0.0, epsilon: float = 0.0):
        self.net, self.mode, self.rng, self.beta, self.epsilon = net, mode, rng, beta, epsilon
        self.teacher = LeastInterferenceFirst(degree=1)
        self.explorers = (BinPack(), LoadBalance())
        self.samples: list[Sample] = []
        self.interval = 0

    def choose_node(self, ledger: Ledger, job: JobView, role: Role, demand: np.ndarray) -> int | None:
        mask = ledger.fits_mask(demand, job, role)
        nodes = np.flatnonzero(mask)
        if nodes.size <= 1:
            return int(nodes[0]) if nodes.size else None
        feeds = harmony_state.encode(ledger, job, role, mask)
        with torch.no_grad():
            logits = self.net.logits(*(torch.from_numpy(feeds[k]) for k in
                                       ("jobs", "current", "role", "nodes", "mask")))[0].numpy()
        if self.mode == "greedy":
            return int(np.argmax(logits))
        if self.mode == "dagger":
            label = self.teacher.choose_node(ledger, job, role, demand)
            self.samples.append(Sample(feeds, label, label, self.interval))
            if self.rng.random() < self.beta:
                return label
            return int(np.argmax(logits))
        # explore
        if self.rng.random() < self.epsilon:
            explorer = self.explorers[int(self.rng.integers(2))]
            node = explorer.choose_node(ledger, job, role, demand)
        else:
            p = np.exp(logits - logits.max())
            p = p * mask
            p /= p.sum()
            node = int(self.rng.choice(len(p), p=p))
        self.samples.append(Sample(feeds, node, -1, self.interval))
        return node


def episode(nodes: int, seed: int, placer, env=None, allocation_name: str = "fixed") -> tuple[dict, list[float]]:
    """One placement_trace to the end with `placer` (wrapped in Sticky); (summary, reward per
    interval). `env`: a reward model to take the jobs' speeds from instead of the simulator's."""
    return run_case(scenarios.placement_trace(nodes, seed), SimConfig(nodes=nodes, seed=seed), placer, env,
                    allocation_name)


def run_case(trace, config: SimConfig, placer, env=None, allocation_name: str = "fixed") -> tuple[dict, list[float]]:
    """`episode` on any trace and simulator configuration (retraining: the cluster's workload,
    its calibrated speeds)."""
    sim = (Simulator(trace, config) if env is None
           else reward_model.RewardModelSimulator(trace, config, env))
    allocation = registry.make_allocation(allocation_name, registry.PolicyContext(speed_model=sim.speed))
    placement = Sticky(placer)

    def admit(snapshot):
        return run_admission(snapshot, allocation, placement, None)

    rewards = []
    while not sim.done:
        if isinstance(placer, Learner):
            placer.interval = len(rewards)
        decision = run_round(sim.snapshot(), allocation, placement, None)
        rewards.append(sim.advance(decision, admit))
    return sim.result().summary(), rewards


def draw_allocation(args: Args, rng: np.random.Generator) -> str:
    """The episode's allocation; with one, no draw (the generator's stream stays the same)."""
    if len(args.allocations) == 1:
        return args.allocations[0]
    return str(rng.choice(args.allocations))


def validation_runs(args: Args):
    """(allocation, nodes, seed) of every validation run."""
    return [(a, nodes, args.val_seed_base + 1000 * nodes + k)
            for a in args.allocations for nodes in args.val_nodes for k in range(args.val_traces)]


def validate(net: networks.HarmonyNet, args: Args, lif: dict[tuple[str, int, int], float]) -> float:
    """Mean over the validation traces of avg JCT / LIF-Line's avg JCT (greedy policy)."""
    net.eval()
    ratios = []
    for run in validation_runs(args):
        allocation, nodes, seed = run
        summary, _ = episode(nodes, seed, Learner(net, "greedy", np.random.default_rng(0)),
                             allocation_name=allocation)
        ratios.append(summary["avg_jct_s"] / lif[run])
    return float(np.mean(ratios))


# ---- batches -------------------------------------------------------------------------------
def collate(samples: list[Sample]) -> dict[str, torch.Tensor]:
    """Pad variable job and node counts; padded nodes are masked, padded jobs are keys never
    attended to."""
    b = len(samples)
    jmax = max(s.feeds["jobs"].shape[1] for s in samples)
    nmax = max(s.feeds["nodes"].shape[1] for s in samples)
    jobs = np.zeros((b, jmax, harmony_state.JOB_FEATURES), np.float32)
    current = np.zeros((b, jmax), np.float32)
    job_pad = np.ones((b, jmax), bool)
    nodes = np.zeros((b, nmax, harmony_state.NODE_FEATURES), np.float32)
    mask = np.zeros((b, nmax), np.float32)
    node_pad = np.ones((b, nmax), bool)
    role = np.zeros((b, 1), np.float32)
    for i, s in enumerate(samples):
        f = s.feeds
        j, n = f["jobs"].shape[1], f["nodes"].shape[1]
        jobs[i, :j], current[i, :j], job_pad[i, :j] = f["jobs"][0], f["current"][0], False
        nodes[i, :n], mask[i, :n], node_pad[i, :n] = f["nodes"][0], f["mask"][0], False
        role[i] = f["role"][0]
    t = torch.from_numpy
    return {"jobs": t(jobs), "current": t(current), "role": t(role), "nodes": t(nodes), "mask": t(mask),
            "job_pad": t(job_pad), "node_pad": t(node_pad)}


def fit_labels(net, opt, data: list[Sample], epochs: int, batch: int, rng) -> float:
    net.train()
    loss_sum, count = 0.0, 0
    for _ in range(epochs):
        order = rng.permutation(len(data))
        for i in range(0, len(order), batch):
            chunk = [data[k] for k in order[i:i + batch]]
            x = collate(chunk)
            logits = net.logits(x["jobs"], x["current"], x["role"], x["nodes"], x["mask"], x["job_pad"])
            loss = torch.nn.functional.cross_entropy(logits, torch.tensor([s.label for s in chunk]))
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss_sum, count = loss_sum + float(loss.detach()) * len(chunk), count + len(chunk)
    return loss_sum / max(count, 1)


def ac_update(net, opt, chunk: list[Sample], beta: float, value_coef: float, critic: bool = True) -> float:
    net.train()
    x = collate(chunk)
    logits, value = net.logits_and_value(x["jobs"], x["current"], x["role"], x["nodes"], x["mask"],
                                         x["job_pad"], x["node_pad"])
    logp = torch.log_softmax(logits, dim=-1)
    ret = torch.tensor([s.ret for s in chunk], dtype=torch.float32)
    action = torch.tensor([s.action for s in chunk])
    adv = (ret - value).detach() if critic else ret - ret.mean()
    probs = logp.exp()
    entropy = -(probs * torch.where(x["mask"] > 0, logp, torch.zeros_like(logp))).sum(-1)
    loss = -(logp.gather(1, action[:, None]).squeeze(1) * adv).mean() - beta * entropy.mean()
    if critic:
        loss = loss + value_coef * ((ret - value) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    opt.step()
    return float(loss.detach())


def actor_critic(net, args: Args, rng: np.random.Generator, draw, validate_at, env=None,
                 deadline: float | None = None) -> int:
    """The actor-critic phase: `args.ac_episodes` episodes, episode e on draw(e) = (trace,
    SimConfig, allocation name), each followed by minibatch updates from the replay;
    validate_at(episodes done, epsilon, entropy weight) every `validate_every` episodes.
    Stops early at `deadline` (time.time()). Returns the episodes run."""
    opt = torch.optim.Adam(net.parameters(), lr=args.ac_lr)
    replay: deque[Sample] = deque(maxlen=args.replay or None)
    bar = tqdm(total=args.ac_episodes, desc="actor-critic", file=sys.stderr, disable=None)
    done_ac = 0
    for e in range(args.ac_episodes):
        if deadline is not None and time.time() > deadline:
            log(f"time budget spent after {e} actor-critic episodes")
            break
        frac = e / max(args.ac_episodes - 1, 1)
        eps = args.epsilon[0] + (args.epsilon[-1] - args.epsilon[0]) * frac
        beta = args.entropy[0] + (args.entropy[-1] - args.entropy[0]) * frac
        trace, config, allocation = draw(e)
        learner = Learner(net, "explore", np.random.default_rng(args.seed * 104729 + e), epsilon=eps)
        net.eval()
        summary, rewards = run_case(trace, config, learner, env, allocation)
        returns = np.zeros(len(rewards))
        acc = 0.0
        for t in range(len(rewards) - 1, -1, -1):
            acc = rewards[t] + args.gamma * acc
            returns[t] = acc
        for s in learner.samples:
            s.ret = float(returns[min(s.interval, len(returns) - 1)])
        if not args.replay:  # no replay: this episode's samples only
            replay.clear()
        replay.extend(learner.samples)
        losses = []
        for _ in range(args.updates_per_episode):
            if len(replay) < args.batch:
                break
            idx = rng.integers(len(replay), size=args.batch)
            losses.append(ac_update(net, opt, [replay[i] for i in idx], beta, args.value_coef, args.critic))
        done_ac = e + 1
        bar.update(1)
        bar.set_postfix(nodes=config.nodes, jct_h=f"{summary['avg_jct_s'] / 3600:.2f}",
                        loss=f"{np.mean(losses or [0]):.3f}")
        if done_ac % args.validate_every == 0:
            validate_at(done_ac, eps, beta)
    bar.close()
    return done_ac


# ---- the run -------------------------------------------------------------------------------
def train(args: Args, argv: list[str] | None = None) -> dict:
    t0 = time.time()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    rng = np.random.default_rng(args.seed)
    net = networks.HarmonyNet(args.d, args.heads, args.layers)
    if args.init:
        net = export.load_state(Path(args.init))
    env = None
    if args.environment == "reward-model":
        if not args.reward_model or not Path(args.reward_model).is_file():
            raise SystemExit(f"--environment reward-model needs --reward-model FILE, the .pt that "
                             f"`python -m policy_models.harmony.reward_model` writes (got {args.reward_model!r})")
        env = reward_model.load(Path(args.reward_model))
        if set(args.train_nodes) != {env.config["nodes"]}:
            raise SystemExit(f"the reward model serves {env.config['nodes']} nodes: use --train-nodes {env.config['nodes']}")
    elif args.environment != "simulator":
        raise SystemExit(f"--environment must be simulator or reward-model, not {args.environment!r}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lif = {run: episode(run[1], run[2], LeastInterferenceFirst(degree=1), allocation_name=run[0])[0]["avg_jct_s"]
           for run in validation_runs(args)}
    curve: list[dict] = []
    best = {"score": float("inf"), "state": None, "where": ""}

    def checkpoint(where: str, **extra) -> None:
        score = validate(net, args, lif)
        curve.append({"where": where, "val_jct_over_lif": score, "minutes": (time.time() - t0) / 60, **extra})
        if score < best["score"]:
            best.update(score=score, state={k: v.clone() for k, v in net.state_dict().items()}, where=where)
        log(f"{where}: validation avg JCT / LIF-Line {score:.3f} (best {best['score']:.3f} at {best['where']})")

    # 1. DAgger on LIF-Line
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    labels: list[Sample] = []
    episode_no = 0
    for r in tqdm(range(args.dagger_rounds), desc="imitation (DAgger)", file=sys.stderr, disable=None):
        beta = 1.0 if r == 0 else 0.5 ** r
        for _ in range(args.dagger_episodes):
            nodes = int(rng.choice(args.train_nodes))
            learner = Learner(net, "dagger", np.random.default_rng(args.seed * 7919 + episode_no), beta=beta)
            net.eval()
            episode(nodes, args.train_seed_base + episode_no, learner,
                    allocation_name=draw_allocation(args, rng))
            episode_no += 1
            labels.extend(learner.samples)
        loss = fit_labels(net, opt, labels, args.bc_epochs, args.batch, rng)
        log(f"dagger round {r + 1}: beta {beta:.2f}, {len(labels)} labels, loss {loss:.3f}")
    checkpoint("imitation" if args.dagger_rounds or not args.init else "start", labels=len(labels))
    export.save_state(net, out / "imitation.pt")

    # 2. Actor-critic with replay
    def draw(e: int):
        nodes = int(rng.choice(args.train_nodes))
        seed = args.train_seed_base + episode_no + e
        return (scenarios.placement_trace(nodes, seed), SimConfig(nodes=nodes, seed=seed),
                draw_allocation(args, rng))

    def validate_at(done: int, eps: float, beta: float) -> None:
        checkpoint(f"actor-critic {done}", epsilon=eps, entropy=beta)

    done_ac = actor_critic(net, args, rng, draw, validate_at, env, deadline=t0 + args.time_budget_min * 60
                           if args.time_budget_min else None)
    if done_ac % args.validate_every:
        checkpoint(f"actor-critic {done_ac}")

    net.load_state_dict(best["state"])
    net.eval()
    export.save_state(net, out / "harmony.pt")  # for --init; not shipped (the ONNX file is)
    wall = time.time() - t0
    training = {"command": "mlsched train harmony " + " ".join(argv or []), "wall_time_s": round(wall, 1),
                "warm_start": f"DAgger on lif-line ({args.dagger_rounds} rounds)" if args.dagger_rounds else args.init,
                "environment": args.environment, "dagger_rounds": args.dagger_rounds,
                "labels": len(labels), "actor_critic_episodes": done_ac, "selected": best["where"],
                "args": {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(args).items()}}
    validation = {"avg_jct_over_lif_line": round(best["score"], 4), "nodes": list(args.val_nodes),
                  "allocations": list(args.allocations),
                  "traces_per_size": args.val_traces, "seeds_from": args.val_seed_base}
    card = export.export(net, out / "harmony.onnx", training, validation,
                         domain=domain.harmony(training["args"]))
    export.plot_curve(curve, out / "learning-curve.png")
    (out / "learning-curve.json").write_text(json.dumps(curve, indent=1) + "\n")
    log(f"best validation {best['score']:.3f} x LIF-Line ({best['where']}); wall time {wall / 60:.1f} min; "
        f"wrote {out / 'harmony.onnx'}")
    return {"card": card, "curve": curve}


def parse_args(argv: list[str] | None) -> Args:
    return parse_into(Args, argv, "mlsched train harmony", __doc__)


def main(argv: list[str] | None = None) -> int:
    train(parse_args(argv), argv=argv)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
