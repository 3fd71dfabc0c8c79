"""A node's GPU type, read from a node label (issue 54). Pure.

NVIDIA's GPU feature discovery labels every GPU node with the product name of its GPUs,
`nvidia.com/gpu.product: Tesla-V100-SXM2-16GB`; the operator reads that label (or the one
`--gpu-type-label` names: a cluster may keep its own, `cloud.google.com/gke-accelerator`,
`node.kubernetes.io/instance-type`, ...) and maps the value to the types the measured table
knows (workloads/gpu_types.py: v100, p100, k80; `from_product_label` looks for the type's
name in the product, case aside).

Two views of one label, deliberately different:

- **for the policies** (`Snapshot.gpu_types`, `node_type`): a table type, or None. A product
  the table does not know (an A100, an H100) is untyped, as a node without the label is: the
  type-aware policies need the type's measured speeds, and untyped is the homogeneous
  default (V100 speeds).
- **for people** (`status.placement.gpuTypes`, `display_name`): the table type where there is
  one, otherwise the label's value as it is (`NVIDIA-A100-SXM4-80GB`), so the status says what
  the pods run on even where the policies cannot tell the speeds apart.

A job restricts a role to table types only (`spec.replicaSpecs.<role>.gpuTypes`, the CRD's
enum): a node with an unknown product or no label is never one of them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence

from mlsched.workloads.gpu_types import GPU_TYPES, from_product_label

DEFAULT_LABEL = "nvidia.com/gpu.product"
#: The label the operator reads a node's GPU type from (`--gpu-type-label`). Read once, at
#: import, like every MLSCHED_* setting the CLI exports before importing the handlers
#: (quantities.GPU_RESOURCE does the same): job records carry it in their node constraints.
GPU_TYPE_LABEL = os.environ.get("MLSCHED_GPU_TYPE_LABEL") or DEFAULT_LABEL


def node_type(labels: Mapping[str, str], label: str = GPU_TYPE_LABEL) -> str | None:
    """The table's type of a node with these labels; None: no label, or a product the
    table does not know."""
    return from_product_label(labels.get(label))


def display_name(labels: Mapping[str, str], label: str = GPU_TYPE_LABEL) -> str | None:
    """What a person is told a node's GPUs are: the table's type, else the label's value as
    written; None when the node has no such label."""
    value = labels.get(label)
    if not value:
        return None
    return from_product_label(value) or value


def ordered(names: Iterable[str]) -> list[str]:
    """Distinct type names, the table's fastest first, then any other names alphabetically."""
    rank = {t: i for i, t in enumerate(GPU_TYPES)}
    return sorted(set(names), key=lambda n: (rank.get(n, len(rank)), n))


def describe(types: Iterable[str]) -> str:
    """`v100`, `v100 or p100`: a role's allowed types in a sentence."""
    names = ordered(types)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def role_names(names: Sequence[str | None] | None,
               nodes: Mapping[str, Sequence[int]]) -> dict[str, str]:
    """Per role, the GPU names (`names`: Snapshot.gpu_names, per node) of its nodes (indexes),
    joined fastest first: "v100", "v100,p100". Roles on no named node are absent."""
    if names is None:
        return {}
    out = {}
    for role, found in nodes.items():
        seen = [n for i in found if (n := names[i]) is not None]
        if seen:
            out[role] = ",".join(ordered(seen))
    return out
