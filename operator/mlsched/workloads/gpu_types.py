"""GPU types: how fast each catalog model trains on each GPU generation, relative to a V100.

Source: Gavel (Narayanan et al., OSDI 2020), the `stanford-futuredata/gavel` repository,
`scheduler/simulation_throughputs.json` (commit c4fa400): the measured single-worker
throughput (steps/s, the `null` entry: running alone) of each Gavel job type on one K80, one
P100 and one V100. The figures below are those throughputs divided by the V100's (V100 = 1.0),
rounded to three places. Only single-worker ratios are used: a job's speed curve over (PS,
workers) stays the catalog's, scaled by the ratio of the slowest GPU type its workers run on.

The catalog's models (workloads/catalog.py) mapped to Gavel job types where the architecture
and task match, at the Gavel batch size nearest the catalog's global batch:

| catalog model | Gavel job type | k80 | p100 | v100 |
|---|---|---|---|---|
| resnet-50 (ImageNet, batch 32) | ResNet-50 (batch size 32), ImageNet | 0.159 | 0.628 | 1.0 |
| resnext-110 (CIFAR-10, batch 128) | ResNet-18 (batch size 128), CIFAR-10: a residual CNN on the same data | 0.100 | 0.649 | 1.0 |
| seq2seq (WMT17 translation, batch 64) | Transformer (batch size 64), translation: same task, attention instead of RNN | 0.203 | 0.591 | 1.0 |
| wlm (PTB word LM, batch 160) | LM (batch size 80), a word-level LSTM LM: Gavel's largest batch | 0.214 | 0.749 | 1.0 |

No Gavel counterpart, so a prior: `vgg-16` and `inception-bn` (no VGG or Inception in Gavel)
get the geometric mean of the ratio over Gavel's single-worker job types (PRIOR: k80 0.209,
p100 0.773), leaving out the five Recommendation types, whose V100 figures in this file lie
below their P100 and K80 ones (in Gavel's `physical_cluster_throughputs.json` the V100 is the
fastest for them too, so we read those as an artefact). A model outside the catalog gets the
prior too. `cnn-text-classification` and `dssm` train on CPU-only workers in the catalog (their
workers request no GPU), so the type of the node is irrelevant to them: 1.0 everywhere
(`relative_speed(..., uses_gpu=False)`).

A node with no GPU type (None) is the homogeneous default: factor 1.0 for every model, so a
cluster with no types behaves exactly as before types existed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

#: The GPU types the table knows, fastest first.
GPU_TYPES: tuple[str, ...] = ("v100", "p100", "k80")
REFERENCE = "v100"

#: Per Gavel job type, single-worker throughput relative to a V100 (simulation_throughputs.json).
GAVEL_RATIOS: dict[str, dict[str, float]] = {
    "ResNet-50 (batch size 32)": {"v100": 1.0, "p100": 0.628, "k80": 0.159},
    "ResNet-18 (batch size 128)": {"v100": 1.0, "p100": 0.649, "k80": 0.100},
    "Transformer (batch size 64)": {"v100": 1.0, "p100": 0.591, "k80": 0.203},
    "LM (batch size 80)": {"v100": 1.0, "p100": 0.749, "k80": 0.214},
}

#: Catalog model -> the Gavel job type whose ratios it takes (see the module doc).
GAVEL_JOB_TYPE: dict[str, str] = {
    "resnet-50": "ResNet-50 (batch size 32)",
    "resnext-110": "ResNet-18 (batch size 128)",
    "seq2seq": "Transformer (batch size 64)",
    "wlm": "LM (batch size 80)",
}

#: Models without a counterpart: the geometric mean over Gavel's single-worker job types
#: (the Recommendation ones left out, module doc).
PRIOR: dict[str, float] = {"v100": 1.0, "p100": 0.773, "k80": 0.209}

#: Catalog models whose workers use no GPU: the node's type does not change their speed.
CPU_ONLY = ("cnn-text-classification", "dssm")


class UnknownGpuTypeError(ValueError):
    pass


def canonical_type(name: str) -> str:
    key = name.strip().lower()
    if key not in GPU_TYPES:
        raise UnknownGpuTypeError(f"unknown GPU type {name!r}; known: {', '.join(GPU_TYPES)}")
    return key


def ratios(model: str) -> dict[str, float]:
    """The model's throughput per GPU type relative to a V100 (the prior for a model with no
    Gavel counterpart, and for a name outside the catalog)."""
    key = model.strip().lower()
    if key == "ctc":
        key = "cnn-text-classification"
    if key in CPU_ONLY:
        return {t: 1.0 for t in GPU_TYPES}
    job_type = GAVEL_JOB_TYPE.get(key)
    return GAVEL_RATIOS[job_type] if job_type is not None else PRIOR


def relative_speed(model: str, gpu_type: str | None, uses_gpu: bool = True) -> float:
    """How fast one worker of `model` trains on a GPU of `gpu_type`, a V100 being 1.0; 1.0
    for no type (the homogeneous default) and for workers that use no GPU."""
    if gpu_type is None or not uses_gpu:
        return 1.0
    return ratios(model)[gpu_type]


def slowest(model: str, types: Iterable[str | None], uses_gpu: bool = True) -> float:
    """The pace of a job whose workers run on `types`: its slowest worker's (1.0 for none,
    or when every type is None)."""
    return min((relative_speed(model, t, uses_gpu) for t in types), default=1.0)


def from_product_label(product: str | None) -> str | None:
    """The table's type for a node's GPU product name, as NVIDIA's GPU feature discovery
    labels it (`nvidia.com/gpu.product`, e.g. `Tesla-V100-SXM2-16GB`); None (untyped, the
    V100's speeds) for no label or a product the table does not know (an A100, an H100)."""
    if not product:
        return None
    name = product.lower()
    for kind in GPU_TYPES:
        if kind in name:
            return kind
    return None


def parse_cluster(text: str) -> tuple[str, ...]:
    """`v100:12,p100:12,k80:12` (GPU type : nodes, in that order) -> one type per node."""
    out: list[str] = []
    seen: set[str] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, count = part.partition(":")
        if not sep:
            raise ValueError(f"GPU types: {part!r} is not TYPE:NODES (e.g. v100:12)")
        kind = canonical_type(name)
        if kind in seen:
            raise ValueError(f"GPU types: {kind} is given twice")
        seen.add(kind)
        try:
            n = int(count)
        except ValueError:
            raise ValueError(f"GPU types: nodes of {kind} must be a whole number, got {count!r}") from None
        if n <= 0:
            raise ValueError(f"GPU types: nodes of {kind} must be > 0, got {n}")
        out.extend([kind] * n)
    if not out:
        raise ValueError("GPU types: no TYPE:NODES given")
    return tuple(out)


def format_cluster(types: Sequence[str | None]) -> str:
    """The inverse of parse_cluster for a cluster laid out type by type."""
    counts: dict[str, int] = {}
    for t in types:
        counts[str(t)] = counts.get(str(t), 0) + 1
    return ",".join(f"{t}:{n}" for t, n in counts.items())


def geometric_mean(values: Iterable[float]) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else 1.0
