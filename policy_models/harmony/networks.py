"""Harmony placement's networks (Bao et al., ToN 2022, §V-A, Fig. 7), sized for any cluster.

Policy: job tokens -> linear embedding -> a Transformer encoder (self-attention over the jobs,
no positional encoding: the job set is unordered) -> the current job's representation, plus
an embedding of the task's role, is the query. Node tokens -> a two-layer embedding. Each
node's score is additive attention of the query over that node (an MLP over
[node, query, node ⊙ query]), masked nodes get probability 0, softmax over nodes. The paper's
output layer has a fixed 2M actions for M servers; scoring node tokens instead serves any
number of nodes with one model.

Critic (training only, not exported): the same encoder's mean job representation and the
mean node embedding -> an MLP -> V(s).

The paper's encoder has 128 units and 8 heads (its Fig. 15 sweep); the default here is 32
units and 4 heads: training on a 2-core CPU finishes in minutes, and the graph (~110 KB) fits
the ConfigMap the operator's manifests ship it in, under the 256 KiB `kubectl apply` keeps in
an annotation (policy_models/artifacts/kustomization.yaml).
The Transformer layer is written out (attention, feed-forward, residuals, layer norm) rather
than taken from nn.TransformerEncoderLayer, whose inference fast path does not export to ONNX
with a variable number of tokens.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from mlsched.features import harmony_state

NEG = -1e9  # masked logits


class EncoderLayer(nn.Module):
    def __init__(self, d: int, heads: int, ff: int):
        super().__init__()
        self.heads, self.dk = heads, d // heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.ff = nn.Sequential(nn.Linear(d, ff), nn.ReLU(), nn.Linear(ff, d))
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)

    def forward(self, x: torch.Tensor, pad: torch.Tensor | None = None,
                select: torch.Tensor | None = None) -> torch.Tensor:
        """(b, t, d) -> (b, t, d); with `select`, the output at that one token only (one_row)."""
        if select is not None:
            return self.one_row(x, select, pad)
        b, t, d = x.shape
        q, k, v = self.qkv(x).reshape(b, t, 3, self.heads, self.dk).permute(2, 0, 3, 1, 4)
        att = q @ k.transpose(-1, -2) / math.sqrt(self.dk)  # (b, h, t, t)
        if pad is not None:  # True where a token is padding (training batches only)
            att = att + pad[:, None, None, :].to(att.dtype) * NEG
        y = (torch.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(b, t, d)
        x = self.norm1(x + self.out(y))
        return self.norm2(x + self.ff(x))

    def one_row(self, x: torch.Tensor, select: torch.Tensor, pad: torch.Tensor | None = None) -> torch.Tensor:
        """`forward(x, pad)` at the one token `select` (one-hot (b, t)) picks: (b, d), the same
        numbers computed for that row only (its query against every key and value), which is
        all the last layer's output is used for in serving: about half that layer's work."""
        b, t, d = x.shape
        xq = (x * select.unsqueeze(-1)).sum(dim=1, keepdim=True)  # (b, 1, d)
        q = nn.functional.linear(xq, self.qkv.weight[:d], self.qkv.bias[:d])
        q = q.reshape(b, 1, self.heads, self.dk).transpose(1, 2)  # (b, h, 1, dk)
        kv = nn.functional.linear(x, self.qkv.weight[d:], self.qkv.bias[d:])
        k, v = kv.reshape(b, t, 2, self.heads, self.dk).permute(2, 0, 3, 1, 4)
        att = q @ k.transpose(-1, -2) / math.sqrt(self.dk)  # (b, h, 1, t)
        if pad is not None:
            att = att + pad[:, None, None, :].to(att.dtype) * NEG
        y = (torch.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(b, 1, d)
        x1 = self.norm1(xq + self.out(y))
        return self.norm2(x1 + self.ff(x1)).squeeze(1)


class HarmonyNet(nn.Module):
    def __init__(self, d: int = 32, heads: int = 4, layers: int = 2):
        super().__init__()
        self.config = {"d": d, "heads": heads, "layers": layers}
        self.job_in = nn.Linear(harmony_state.JOB_FEATURES, d)
        self.encoder = nn.ModuleList(EncoderLayer(d, heads, 2 * d) for _ in range(layers))
        self.role_in = nn.Linear(1, d)
        self.node_in = nn.Sequential(nn.Linear(harmony_state.NODE_FEATURES, d), nn.ReLU(), nn.Linear(d, d))
        self.score = nn.Sequential(nn.Linear(3 * d, d), nn.ReLU(), nn.Linear(d, d), nn.ReLU(), nn.Linear(d, 1))
        self.value_head = nn.Sequential(nn.Linear(3 * d, d), nn.ReLU(), nn.Linear(d, 1))

    def _encode(self, jobs, current, role, nodes, job_pad=None):
        h = self.job_in(jobs)
        for layer in self.encoder:
            h = layer(h, job_pad)
        query = (h * current.unsqueeze(-1)).sum(dim=1) + self.role_in(role)  # (b, d)
        return h, query, self.node_in(nodes)

    def _scores(self, query, n, mask) -> torch.Tensor:
        """Additive attention of the query over each node, masked nodes at NEG: (b, nodes)."""
        q = query.unsqueeze(1).expand_as(n)
        return self.score(torch.cat([n, q, n * q], dim=-1)).squeeze(-1) + (1.0 - mask) * NEG

    def query(self, jobs, current, role, job_pad=None) -> torch.Tensor:
        """`_encode`'s query with the last layer computed for the current job only (equal
        numbers, less work: what acting and the exported graph use)."""
        h = self.job_in(jobs)
        if not self.encoder:
            return (h * current.unsqueeze(-1)).sum(dim=1) + self.role_in(role)
        for layer in self.encoder[:-1]:
            h = layer(h, job_pad)
        # Called as a module (not .one_row) so that the exported graph names its nodes by the
        # layer, which export.state_from_onnx relies on.
        return self.encoder[-1](h, job_pad, select=current) + self.role_in(role)

    def logits(self, jobs, current, role, nodes, mask, job_pad=None) -> torch.Tensor:
        return self._scores(self.query(jobs, current, role, job_pad), self.node_in(nodes), mask)

    def logits_and_value(self, jobs, current, role, nodes, mask, job_pad=None, node_pad=None):
        h, query, n = self._encode(jobs, current, role, nodes, job_pad)
        scores = self._scores(query, n, mask)
        jw = (1.0 - job_pad.float()) if job_pad is not None else torch.ones(h.shape[:2])
        nw = (1.0 - node_pad.float()) if node_pad is not None else torch.ones(n.shape[:2])
        hm = (h * jw.unsqueeze(-1)).sum(1) / jw.sum(1, keepdim=True).clamp(min=1)
        nm = (n * nw.unsqueeze(-1)).sum(1) / nw.sum(1, keepdim=True).clamp(min=1)
        value = self.value_head(torch.cat([hm, nm, query], dim=-1)).squeeze(-1)
        return scores, value


class ProbabilityModule(nn.Module):
    """What ships: (jobs, current, role, nodes, mask) -> per-node probabilities, masked nodes
    exactly 0."""

    def __init__(self, net: HarmonyNet):
        super().__init__()
        self.net = net

    def forward(self, jobs, current, role, nodes, mask):
        return torch.softmax(self.net.logits(jobs, current, role, nodes, mask), dim=-1)
