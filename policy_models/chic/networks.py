"""Chic's policy network (§3.1): a small MLP, softmax over the allowed actions.

The paper's 64 (ReLU, dropout 0.5) - 32 (ReLU) - 4: we read the 4 as Chic-Pair's output
layer (I + 1 = 4 actions at I = 3), so Chic has 64-32-(2I+1) and Chic-Pair 64-32-(I+1);
a 4-unit hidden layer in front of Chic's 7 outputs would be a bottleneck the paper does not
motivate. Dropout acts in training only; the exported graph is the eval-mode network.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from mlsched.features import chic_state

NEG = -1e9  # masked logits


def masked_logits(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return logits + (1.0 - mask) * NEG


class ChicNet(nn.Module):
    def __init__(self, jobs: int, pair: bool, hidden: tuple[int, ...] = (64, 32), dropout: float = 0.5):
        super().__init__()
        layers: list[nn.Module] = []
        width = chic_state.state_dim(jobs)
        for k, h in enumerate(hidden):
            layers += [nn.Linear(width, h), nn.ReLU()]
            if k == 0 and dropout > 0:
                layers.append(nn.Dropout(dropout))
            width = h
        layers.append(nn.Linear(width, chic_state.n_actions(jobs, pair)))
        self.net = nn.Sequential(*layers)

    def logits(self, state: torch.Tensor) -> torch.Tensor:
        return self.net(state)


class ProbabilityModule(nn.Module):
    """What ships: (state, mask) -> action probabilities, masked actions exactly 0."""

    def __init__(self, net: ChicNet):
        super().__init__()
        self.net = net

    def forward(self, state: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.softmax(masked_logits(self.net.logits(state), mask), dim=-1)


class NumpyPolicy:
    """A numpy copy of the eval-mode network for rollouts (faster than torch at batch 1)."""

    def __init__(self, net: ChicNet):
        self.layers = [(m.weight.detach().numpy().T.copy(), m.bias.detach().numpy().copy())
                       for m in net.net if isinstance(m, nn.Linear)]

    def logits(self, state: np.ndarray) -> np.ndarray:
        x = state
        for k, (w, b) in enumerate(self.layers):
            x = x @ w + b
            if k < len(self.layers) - 1:
                x = np.maximum(x, 0.0)
        return x

    def probabilities(self, state: np.ndarray, mask: np.ndarray) -> np.ndarray:
        z = np.where(mask, self.logits(state), -np.inf)
        e = np.exp(z - z.max())
        return e / e.sum()
