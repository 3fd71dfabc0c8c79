"""Harmony's reward model (§VI, Fig. 9): a Transformer that predicts each job's epochs per
interval from a placement, so that policy training needs no cluster time.

    python -m policy_models.harmony.reward_model [--samples 29264] [--out DIR]

Samples: on the paper's testbed size (6 nodes of 8 cores, 2 GPUs, 48 GiB), a random set of
jobs (catalog models, 30 % all-reduce, 1-4 workers and 1-2 PS each) placed at random where
they fit until the cluster is full or the set is placed, each job's speed from the
simulator (measured speed table x interference, sim-2) with 5 % multiplicative measurement
noise: what running each placement for a few minutes on a testbed would give. The paper
collected 29,264 such samples in 5-minute runs; here they cost seconds.

Input, one token per placed job (the paper's s_n = (x_n, w_n, p_n, d_n); demands are left out
because the model type implies them): model one-hot | all-reduce | workers ÷ 8 | PS ÷ 4 |
workers on each node ÷ 4 | PS on each node ÷ 4 (2M entries: the paper's placement vector,
which fixes the node count, so one reward model serves one cluster size).
Network: linear embedding, two Transformer encoder layers (no positional encoding), a linear
output per job: log of its epochs per interval. Loss: the paper's mean relative error,
|ĉ − c| / c. Adam with the Transformer warm-up schedule (Vaswani et al.), batch 32.
Reported: mean relative error and the share of predictions within 10 % on a held-out 10 %
(the paper: 6.9 % and 83 %).

`RewardModelSimulator` is the simulator with job speeds from the reward model instead of the
speed table and the interference model: the environment for training a policy offline
(`mlsched train harmony --environment reward-model`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from mlsched.features.harmony_state import N_MODELS, model_slot
from mlsched.sim.simulator import SimConfig, Simulator
from mlsched.workloads import catalog, interference
from mlsched.workloads.speed_models import epochs_per_s, get_speed_model
from policy_models.harmony.networks import EncoderLayer

INTERVAL_S = 1200.0
NODES = 6


def token_width(nodes: int) -> int:
    return N_MODELS + 3 + 2 * nodes


def job_token(model: str, arch: str, ps_nodes, worker_nodes, nodes: int) -> np.ndarray:
    row = np.zeros(token_width(nodes), np.float32)
    row[model_slot(model)] = 1.0
    row[N_MODELS] = 1.0 if arch == "allreduce" else 0.0
    row[N_MODELS + 1] = len(worker_nodes) / 8.0
    row[N_MODELS + 2] = len(ps_nodes) / 4.0
    base = N_MODELS + 3
    for n in worker_nodes:
        row[base + n] += 0.25
    for n in ps_nodes:
        row[base + nodes + n] += 0.25
    return row


def true_epochs(speed, jobs: list[dict], node_cpus: float = 8.0) -> np.ndarray:
    """Epochs per interval of each placed job, as the simulator computes them."""
    placements = {f"j{i}": (j["model"], list(j["ps"]) + list(j["workers"])) for i, j in enumerate(jobs)}
    factors = interference.job_speed_factors(placements, None, interference.node_capacity(node_cpus))
    out = []
    for i, j in enumerate(jobs):
        base = epochs_per_s(speed, j["model"], j["arch"], len(j["ps"]), len(j["workers"]),
                            len(set(j["workers"])))
        out.append(base * factors[f"j{i}"] * INTERVAL_S)
    return np.array(out)


def random_placement(rng: np.random.Generator, nodes: int, config: SimConfig) -> list[dict]:
    """Jobs placed at random where they fit (gang: all tasks or none), until a job fails."""
    free = config.capacity().copy()
    jobs = []
    for _ in range(int(rng.integers(1, 4 * nodes))):
        model = catalog.MODEL_NAMES[int(rng.integers(len(catalog.MODEL_NAMES)))]
        arch = "allreduce" if rng.random() < 0.3 else "ps"
        roles = ["worker"] * int(rng.integers(1, 5)) + (["ps"] * int(rng.integers(1, 3)) if arch == "ps" else [])
        placed = _place_gang(rng, free, config, model, roles)
        if placed is None:
            break
        jobs.append({"model": model, "arch": arch, "ps": placed["ps"], "workers": placed["worker"]})
    return jobs


def _place_gang(rng: np.random.Generator, free: np.ndarray, config: SimConfig, model: str,
                roles: list[str]) -> dict[str, list[int]] | None:
    """Each task on a random node it fits on, booked in `free`; None (and `free` untouched)
    when one does not fit."""
    trial = free.copy()
    placed: dict[str, list[int]] = {"ps": [], "worker": []}
    for role in roles:
        demand = config.demand(model, role)
        fits = np.flatnonzero(np.all(trial >= demand - 1e-9, axis=1))
        if not fits.size:
            return None
        n = int(rng.choice(fits))
        trial[n] -= demand
        placed[role].append(n)
    free[:] = trial
    return placed


def make_samples(count: int, nodes: int, noise: float, seed: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(tokens, measured epochs per interval (with noise), true epochs per interval) per sample."""
    rng = np.random.default_rng(seed)
    config = SimConfig(nodes=nodes)
    speed = get_speed_model("measured")
    samples = []
    with tqdm(total=count, desc="reward-model samples", file=sys.stderr, disable=None, leave=False) as bar:
        while len(samples) < count:
            jobs = random_placement(rng, nodes, config)
            if not jobs:
                continue
            x = np.stack([job_token(j["model"], j["arch"], j["ps"], j["workers"], nodes) for j in jobs])
            clean = true_epochs(speed, jobs)
            y = clean * (1.0 + noise * rng.standard_normal(len(jobs)))
            samples.append((x, np.maximum(y, 1e-6).astype(np.float32), clean.astype(np.float32)))
            bar.update(1)
    return samples


class RewardNet(nn.Module):
    def __init__(self, nodes: int = NODES, d: int = 64, heads: int = 4, layers: int = 2):
        super().__init__()
        self.config = {"nodes": nodes, "d": d, "heads": heads, "layers": layers}
        self.embed = nn.Sequential(nn.Linear(token_width(nodes), d), nn.ReLU(), nn.Linear(d, d))
        self.encoder = nn.ModuleList(EncoderLayer(d, heads, 2 * d) for _ in range(layers))
        self.head = nn.Linear(d, 1)

    def forward(self, x: torch.Tensor, pad: torch.Tensor | None = None) -> torch.Tensor:
        h = self.embed(x)
        for layer in self.encoder:
            h = layer(h, pad)
        return self.head(h).squeeze(-1)  # log epochs per interval


def _batch(samples, label: int = 1):
    """Padded (tokens, labels, padding); `label` 1: the measured speeds, 2: the true ones."""
    t = max(len(s[0]) for s in samples)
    w = samples[0][0].shape[1]
    x = np.zeros((len(samples), t, w), np.float32)
    y = np.ones((len(samples), t), np.float32)
    pad = np.ones((len(samples), t), bool)
    for i, s in enumerate(samples):
        x[i, :len(s[0])], y[i, :len(s[0])], pad[i, :len(s[0])] = s[0], s[label], False
    return torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(pad)


def relative_errors(net: RewardNet, samples, label: int = 1) -> np.ndarray:
    net.eval()
    errs = []
    with torch.no_grad():
        for i in range(0, len(samples), 256):
            x, y, pad = _batch(samples[i:i + 256], label)
            rel = (torch.exp(net(x, pad)) - y).abs() / y
            errs.append(rel[~pad].numpy())
    return np.concatenate(errs)


def train(samples: int = 29264, nodes: int = NODES, noise: float = 0.05, epochs: int = 12, seed: int = 5,
          warmup: int = 1000, d: int = 64) -> tuple[RewardNet, dict]:
    t0 = time.time()
    torch.manual_seed(seed)
    data = make_samples(samples, nodes, noise, seed)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(data))
    split = int(0.9 * len(data))  # the paper's 90 / 10
    train_set = [data[i] for i in order[:split]]
    test_set = [data[i] for i in order[split:]]
    net = RewardNet(nodes, d=d)
    opt = torch.optim.Adam(net.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    # Vaswani et al.'s schedule: d^-0.5 * min(step^-0.5, step * warmup^-1.5)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: d ** -0.5 * min((s + 1) ** -0.5, (s + 1) * warmup ** -1.5))
    for _ in tqdm(range(epochs), desc="reward model", file=sys.stderr, disable=None):
        net.train()
        perm = rng.permutation(len(train_set))
        for i in range(0, len(perm), 32):
            x, y, pad = _batch([train_set[k] for k in perm[i:i + 32]])
            rel = (torch.exp(net(x, pad)) - y).abs() / y
            loss = rel[~pad].mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    errs = relative_errors(net, test_set)
    true_errs = relative_errors(net, test_set, label=2)
    report = {"samples": len(data), "test_jobs": int(errs.size), "nodes": nodes, "noise": noise, "d": d,
              "mean_relative_error": round(float(errs.mean()), 4),
              "within_10_percent": round(float((errs <= 0.10).mean()), 4),
              # against the noise-free speeds: how well it learned the function itself
              "mean_relative_error_vs_true": round(float(true_errs.mean()), 4),
              "within_10_percent_vs_true": round(float((true_errs <= 0.10).mean()), 4),
              "wall_time_s": round(time.time() - t0, 1), "epochs": epochs}
    return net, report


class RewardModelSimulator(Simulator):
    """The simulator with every placed job's speed from the reward model (the paper's offline
    environment). Its node count must be the reward model's."""

    def __init__(self, trace, config: SimConfig, net: RewardNet):
        if config.nodes != net.config["nodes"]:
            raise ValueError(f"the reward model is for {net.config['nodes']} nodes, not {config.nodes}")
        super().__init__(trace, config)
        self.net = net.eval()

    def _rates(self) -> dict[str, float]:
        placed = [s for s in self.active if s.worker_nodes and s.finish_s is None]
        if not placed:
            return {}
        x = np.stack([job_token(s.spec.model, s.spec.arch, s.ps_nodes, s.worker_nodes, self.config.nodes)
                      for s in placed])
        with torch.no_grad():
            c = torch.exp(self.net(torch.from_numpy(x)[None]))[0].numpy()
        return {s.spec.name: float(c[i]) / INTERVAL_S for i, s in enumerate(placed)}


def save(net: RewardNet, report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    torch.save({"config": net.config, "state": net.state_dict()}, out / "reward-model.pt")
    (out / "reward-model.json").write_text(json.dumps(report, indent=2) + "\n")


def load(path: Path) -> RewardNet:
    raw = torch.load(path, weights_only=True)
    net = RewardNet(**raw["config"])
    net.load_state_dict(raw["state"])
    return net.eval()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=29264)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--noise", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--out", default="/tmp/harmony-reward-model")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    net, report = train(args.samples, NODES, args.noise, args.epochs, args.seed, d=args.d)
    save(net, report, Path(args.out))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
