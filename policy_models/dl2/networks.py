"""DL²'s policy and value networks, in torch, plus a numpy copy of the policy for fast rollouts.

Two architectures over the same state vector (J job rows + global features):
- `flat`: the paper's — the whole state through fully connected ReLU layers to 3J+1 logits.
- `shared`: one small network scores every job row (with the global features and a mean of
  all job embeddings as context) into its 3 action logits, and the pooled context gives the
  stop logit. The context is the mean and the max of all job embeddings (the max lets a job
  tell whether it holds, say, the smallest share). Weights are shared across job slots, so it
  learns from every slot at once; the arrival rank is a feature, not a position.
Both take the same inputs (state, mask) and export to the same ONNX signature.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from mlsched.features import dl2_state

NEG = -1e9  # masked logits


def masked_logits(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return logits + (1.0 - mask) * NEG


class FlatPolicy(nn.Module):
    def __init__(self, window: int, hidden: tuple[int, ...] = (256, 256), typed: bool = False):
        super().__init__()
        self.window, self.typed = window, typed
        layers, width = [], dl2_state.state_dim(window, typed)
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        self.trunk = nn.Sequential(*layers)
        self.head = nn.Linear(width, dl2_state.n_actions(window))
        self.value_trunk = nn.Sequential(*[m for m in _mlp(dl2_state.state_dim(window, typed), hidden)])
        self.value_head = nn.Linear(hidden[-1], 1)

    def logits(self, state: torch.Tensor) -> torch.Tensor:
        return self.head(self.trunk(state))

    def value(self, state: torch.Tensor) -> torch.Tensor:
        return self.value_head(self.value_trunk(state)).squeeze(-1)


def _mlp(width: int, hidden: tuple[int, ...]) -> list[nn.Module]:
    out = []
    for h in hidden:
        out += [nn.Linear(width, h), nn.ReLU()]
        width = h
    return out


class SharedPolicy(nn.Module):
    def __init__(self, window: int, hidden: tuple[int, ...] = (128, 128), typed: bool = False):
        super().__init__()
        self.window, self.typed = window, typed
        f, g = dl2_state.job_features(typed), dl2_state.GLOBAL_FEATURES
        h1, h2 = hidden[0], hidden[-1]
        self.embed = nn.Sequential(nn.Linear(f + g, h1), nn.ReLU())
        self.score = nn.Sequential(nn.Linear(3 * h1, h2), nn.ReLU(), nn.Linear(h2, 3))
        self.stop = nn.Sequential(nn.Linear(2 * h1 + g, h2), nn.ReLU(), nn.Linear(h2, 1))
        # The value network has its own job embedding: its regression never moves the policy.
        self.value_embed = nn.Sequential(nn.Linear(f + g, h1), nn.ReLU())
        self.value_net = nn.Sequential(nn.Linear(2 * h1 + g, h2), nn.ReLU(), nn.Linear(h2, h2), nn.ReLU(),
                                       nn.Linear(h2, 1))

    def _context(self, state: torch.Tensor, embed: nn.Module | None = None):
        j, f = self.window, dl2_state.job_features(self.typed)
        jobs = state[:, : j * f].reshape(-1, j, f)
        glob = state[:, j * f:]
        valid = jobs[:, :, dl2_state._VALID:dl2_state._VALID + 1]  # the `valid` column
        # The embedding of [job row, global features], with the global half multiplied once
        # rather than once per row (the same function as Linear on the concatenation; the
        # exported graph skips an Expand and a Concat and is about 20 % faster to serve).
        linear = (embed or self.embed)[0]
        e = torch.relu(jobs @ linear.weight[:, :f].T
                       + (glob @ linear.weight[:, f:].T + linear.bias).unsqueeze(1)) * valid
        mean = e.sum(dim=1) / valid.sum(dim=1).clamp(min=1.0)
        pooled = torch.cat([mean, e.max(dim=1).values], dim=-1)  # embeddings are >= 0: empty rows never win
        return e, pooled, glob

    def logits(self, state: torch.Tensor) -> torch.Tensor:
        e, pooled, glob = self._context(state)
        # score[0] sees [own embedding, pooled context]; the context half is the same for every
        # job, so it is multiplied once, not once per job (3x fewer operations when served).
        # Sizes come from the weights, not from tensor shapes, so the exporter writes them as
        # constants and ONNX Runtime folds the weight slices away (no Shape/Gather/Slice per call).
        first = self.score[0]
        h1 = first.weight.shape[1] // 3
        hidden = torch.relu(e @ first.weight[:, :h1].T + (pooled @ first.weight[:, h1:].T + first.bias).unsqueeze(1))
        per_job = self.score[2](hidden)
        stop = self.stop(torch.cat([pooled, glob], dim=-1))
        return torch.cat([per_job.reshape(-1, 3 * self.window), stop], dim=-1)

    def value(self, state: torch.Tensor) -> torch.Tensor:
        _, pooled, glob = self._context(state, self.value_embed)
        return self.value_net(torch.cat([pooled, glob], dim=-1)).squeeze(-1)


def build(arch: str, window: int, hidden: tuple[int, ...], typed: bool = False) -> nn.Module:
    """`typed`: the state has the GPU-type columns (dl2_state.TYPED_JOB_FEATURES per job)."""
    if arch == "flat":
        return FlatPolicy(window, hidden, typed)
    if arch == "shared":
        return SharedPolicy(window, hidden, typed)
    raise ValueError(f"unknown DL² network architecture {arch!r}; choose flat or shared")


class ProbabilityModule(nn.Module):
    """What ships: (state, mask) -> action probabilities, masked actions exactly 0."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, state: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.softmax(masked_logits(self.net.logits(state), mask), dim=-1)


class NumpyPolicy:
    """A numpy copy of a policy network's logits, several times faster than torch at batch 1;
    rollouts use it and refresh it after every update. The shared network's concatenations are
    split into separate matmuls, and only the window's occupied job rows are computed (empty
    rows are masked anyway; their logits are left at -inf-safe zeros)."""

    def __init__(self, net: nn.Module):
        self.arch = "shared" if isinstance(net, SharedPolicy) else "flat"
        self.window = getattr(net, "window", None)
        self.f = dl2_state.job_features(getattr(net, "typed", False))
        p = {k: v.detach().cpu().numpy().astype(np.float32) for k, v in net.state_dict().items()}
        if self.arch == "flat":
            self.layers = []
            i = 0
            while f"trunk.{i}.weight" in p:
                self.layers.append((p[f"trunk.{i}.weight"].T.copy(), p[f"trunk.{i}.bias"]))
                i += 2
            self.head = (p["head.weight"].T.copy(), p["head.bias"])
            return
        f = self.f
        w = p["embed.0.weight"].T
        self.embed_jobs, self.embed_glob, self.embed_b = w[:f].copy(), w[f:].copy(), p["embed.0.bias"]
        h1 = self.embed_b.size
        w = p["score.0.weight"].T
        self.score_e, self.score_p, self.score_b = w[:h1].copy(), w[h1:].copy(), p["score.0.bias"]
        self.score2_w, self.score2_b = p["score.2.weight"].T.copy(), p["score.2.bias"]
        w = p["stop.0.weight"].T
        self.stop_p, self.stop_g, self.stop_b = w[:2 * h1].copy(), w[2 * h1:].copy(), p["stop.0.bias"]
        self.stop2_w, self.stop2_b = p["stop.2.weight"].T.copy(), p["stop.2.bias"]

    def logits(self, state: np.ndarray) -> np.ndarray:
        if self.arch == "flat":
            x = state
            for w, b in self.layers:
                x = np.maximum(x @ w + b, 0)
            return x @ self.head[0] + self.head[1]
        j, f = self.window, self.f
        glob = state[j * f:]
        jobs = state[: j * f].reshape(j, f)
        n = int(jobs[:, dl2_state._VALID].sum())  # occupied rows come first
        e = np.maximum(jobs[:n] @ self.embed_jobs + (glob @ self.embed_glob + self.embed_b), 0)
        pooled = np.concatenate([e.sum(axis=0) / max(n, 1), e.max(axis=0) if n else np.zeros(e.shape[1], np.float32)])
        z = np.maximum(e @ self.score_e + (pooled @ self.score_p + self.score_b), 0)
        out = np.zeros(3 * j + 1, dtype=np.float32)
        out[: 3 * n] = (z @ self.score2_w + self.score2_b).reshape(-1)
        s = np.maximum(pooled @ self.stop_p + glob @ self.stop_g + self.stop_b, 0)
        out[-1] = (s @ self.stop2_w + self.stop2_b)[0]
        return out

    def probabilities(self, state: np.ndarray, mask: np.ndarray) -> np.ndarray:
        z = np.where(mask, self.logits(state), -np.inf)
        z = z - z.max()
        e = np.exp(z)
        return e / e.sum()
