"""Dynamic Resource Allocation (resource.k8s.io/v1, GA in Kubernetes 1.34): devices a pod
asks for through ResourceClaims, counted per node like extended resources. Pure.

A GPU, NIC or FPGA exposed by a DRA driver is not in a node's allocatable: the driver
publishes the node's devices in ResourceSlices, a DeviceClass selects devices by CEL over
their driver and attributes, and a pod names a ResourceClaimTemplate whose requests ask for
`count` devices of a class; kube-controller-manager makes one ResourceClaim per pod and
kube-scheduler allocates it devices on the node it picks ("cannot allocate all claims" where
the node has too few left). Planned from the template's container requests alone, such a job
asked for no device at all: bin-packing pinned one-device workers beyond the two devices their
node publishes, kube-scheduler refused them (`Displaced` Events, an `Unschedulable` Warning),
and a gang was admitted onto devices other pods' claims held (two of its pods stayed Pending).

Here each DeviceClass becomes a counted resource, `dra:<class>` (counted_resources.py does the
rest, as for `example.com/nic`): a node has as many as its node-local ResourceSlices hold
devices the class selects (`Catalogue`); a role's pods take what their claim templates'
requests ask (`template_takes`); the devices allocated to claims of pods the round does not
re-decide are used (`claimed`). A request that narrows its class with selectors of its own
(a GPU model, a MIG profile: `device.attributes['gpu.nvidia.com'].profile == '1g.10gb'`) is
a counted resource of its own, `dra:<class>[<conditions>]` (`refined_key`): the class's
devices that also meet them. A device counts for its class and for every such refinement it
meets, each kept separately, so a node whose one h100 was taken through the plain class
still shows it free to the refinement for a moment (kube-scheduler's refusal then moves the
pod; templates mixing the two on one cluster are rare). A template or class that does not exist blocks the job with
the reason, as the API server's own objections do (limitranges.as_planned).

What is not counted, left to kube-scheduler as before (documented in docs/operator.md):
- class selectors other than conjunctions of `device.driver == '...'` and
  `device.attributes['<domain>'].<name> == <literal>` (no CEL library; those are the forms
  drivers' classes use); such a class's requests count nothing;
- requests whose own selectors are not such conjunctions, `allocationMode: All`,
  `firstAvailable` lists and `adminAccess` (which allocates no device exclusively);
- shared claims named by `resourceClaimName` (one claim for many pods), and slices that are
  not node-local (`nodeSelector`, `allNodes`: network-attached devices).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mlsched.controller.constraints.node_constraints import DEVICE_PREFIX

#: The counted resource a DeviceClass becomes: `dra:<class>`.
PREFIX = DEVICE_PREFIX

#: DeviceClasses whose devices are GPUs (--gpu-device-class; read at import, as
#: quantities.GPU_RESOURCE is): besides being counted, they are folded into the GPU dimension, so
#: that a node publishing two has 2 GPUs and a pod claiming one asks for 1 GPU: DRF's shares
#: and DL²'s state see a GPU job, not a CPU one. NVIDIA's DRA driver names its class
#: gpu.nvidia.com.
GPU_CLASSES: frozenset[str] = frozenset(
    c.strip() for c in (os.environ.get("MLSCHED_GPU_DEVICE_CLASSES") or "gpu.nvidia.com").split(",")
    if c.strip())

Value = str | bool | int
# ("driver", value) or (domain, attribute, value): one equality of a class's selector.
Condition = tuple[str, str, Value] | tuple[str, Value]
Counted = tuple[tuple[str, float], ...]
Refinement = tuple[str, tuple[Condition, ...]]  # (class, conditions of a request's selectors)


def key(class_name: str) -> str:
    return PREFIX + class_name


def refined_key(class_name: str, conditions: tuple[Condition, ...] = ()) -> str:
    """The counted resource of a request: its class's key, narrowed by the conditions of the
    request's own selectors if any: `dra:gpu.nvidia.com[gpu.nvidia.com/productName='H100']`."""
    if not conditions:
        return key(class_name)
    return f"{key(class_name)}[{','.join(sorted(_condition_text(c) for c in conditions))}]"


def class_key(counted: str) -> str:
    """The class's key of a (possibly refined) device key: what a quota on the class counts."""
    return counted.split("[", 1)[0]


def _condition_text(condition: Condition) -> str:
    value = condition[-1]
    shown = f"'{value}'" if isinstance(value, str) else str(value).lower()
    return f"driver={shown}" if len(condition) == 2 else f"{condition[0]}/{condition[1]}={shown}"


def meets(conditions: tuple[Condition, ...], driver: str,
          attributes: Mapping[tuple[str, str], Value]) -> bool:
    """Whether a device of `driver` with `attributes` meets every condition."""
    for condition in conditions:
        if len(condition) == 2:
            if driver != condition[1]:
                return False
        elif attributes.get((condition[0], condition[1])) != condition[2]:  # type: ignore[misc]
            return False
    return True


# ---------------------------------------------------------------------------- DeviceClasses

_STRING = r"""'([^'\\]*)'|"([^"\\]*)\""""
_DRIVER = re.compile(r"device\.driver")
_ATTRIBUTE = re.compile(rf"device\.attributes\[(?:{_STRING})\](?:\.([A-Za-z_][\w]*)|\[(?:{_STRING})\])")
_LITERAL = re.compile(rf"(?:{_STRING})|(true|false)|(-?\d+)")


def _literal(text: str) -> Value | None:
    m = _LITERAL.fullmatch(text)
    if m is None:
        return None
    single, double, boolean, integer = m.groups()
    if single is not None or double is not None:
        return single if single is not None else double
    if boolean is not None:
        return boolean == "true"
    return int(integer)


def _subject(text: str) -> tuple[str, ...] | None:
    if _DRIVER.fullmatch(text):
        return ("driver",)
    m = _ATTRIBUTE.fullmatch(text)
    if m is None:
        return None
    d1, d2, name, n1, n2 = m.groups()
    domain = d1 if d1 is not None else d2
    return (domain, name if name is not None else (n1 if n1 is not None else n2))


def _split_and(expression: str) -> list[str] | None:
    """The `&&` operands of an expression, outside quotes; None for `||` or `!`."""
    parts, depth, quote, start = [], 0, "", 0
    text = expression
    i = 0
    while i < len(text):
        c = text[i]
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif text.startswith("&&", i) and depth == 0:
            parts.append(text[start:i])
            start = i + 2
            i += 1
        elif text.startswith("||", i) or (c == "!" and not text.startswith("!=", i)):
            return None
        i += 1
    parts.append(text[start:])
    return parts


def _strip_parens(text: str) -> str:
    text = text.strip()
    while text.startswith("(") and text.endswith(")") and _balanced(text[1:-1]):
        text = text[1:-1].strip()
    return text


def _balanced(text: str) -> bool:
    depth = 0
    for c in text:
        depth += {"(": 1, ")": -1}.get(c, 0)
        if depth < 0:
            return False
    return depth == 0


def parse_selector(expression: str) -> tuple[Condition, ...] | None:
    """The equalities a CEL selector is the conjunction of; None if it is anything else."""
    conditions: list[Condition] = []
    stack = [expression]
    while stack:
        parts = _split_and(_strip_parens(stack.pop()))
        if parts is None:
            return None
        if len(parts) > 1:
            stack.extend(parts)
            continue
        sides = parts[0].split("==")
        if len(sides) != 2:
            return None
        left, right = (s.strip() for s in sides)
        subject, value = _subject(left), _literal(right)
        if subject is None or value is None:
            subject, value = _subject(right), _literal(left)
        if subject is None or value is None:
            return None
        conditions.append((*subject, value))  # type: ignore[arg-type]
    return tuple(conditions)


@dataclass(frozen=True)
class DeviceClassRecord:
    name: str
    # The equalities its selectors require together; None: a selector this module cannot
    # read (its requests are not counted).
    conditions: tuple[Condition, ...] | None

    def selects(self, driver: str, attributes: Mapping[tuple[str, str], Value]) -> bool:
        assert self.conditions is not None
        return meets(self.conditions, driver, attributes)


def selectors_conditions(selectors: Any) -> tuple[Condition, ...] | None:
    """The conditions a list of `{cel: {expression}}` selectors require together; None if one
    is not a conjunction this module reads."""
    conditions: list[Condition] = []
    for selector in selectors or ():
        expression = ((selector or {}).get("cel") or {}).get("expression") \
            if isinstance(selector, Mapping) else None
        parsed = parse_selector(expression) if isinstance(expression, str) else None
        if parsed is None:
            return None
        conditions.extend(parsed)
    return tuple(conditions)


def device_class_record(body: Mapping[str, Any]) -> DeviceClassRecord:
    return DeviceClassRecord(name=(body.get("metadata") or {}).get("name", ""),
                             conditions=selectors_conditions((body.get("spec") or {}).get("selectors")))


# ---------------------------------------------------------------------------- ResourceSlices


@dataclass(frozen=True)
class SliceRecord:
    name: str
    driver: str
    pool: str
    generation: int
    node: str | None  # spec.nodeName; None for network-attached devices (not counted)
    # (device name, {(domain, attribute): value}) per device.
    devices: tuple[tuple[str, Mapping[tuple[str, str], Value]], ...] = ()


def _attribute_value(value: Any) -> Value | None:
    if not isinstance(value, Mapping):
        return None
    for kind in ("string", "bool", "int", "version"):
        if kind in value:
            return value[kind]
    return None


def resource_slice_record(body: Mapping[str, Any]) -> SliceRecord:
    spec = body.get("spec") or {}
    driver = str(spec.get("driver") or "")
    pool = spec.get("pool") or {}
    devices = []
    for device in spec.get("devices") or ():
        attributes: dict[tuple[str, str], Value] = {}
        for qualified, value in ((device or {}).get("attributes") or {}).items():
            domain, _, name = str(qualified).rpartition("/")
            parsed = _attribute_value(value)
            if parsed is not None:
                attributes[(domain or driver, name)] = parsed
        devices.append((str((device or {}).get("name") or ""), attributes))
    return SliceRecord(name=(body.get("metadata") or {}).get("name", ""), driver=driver,
                       pool=str(pool.get("name") or ""), generation=int(pool.get("generation") or 0),
                       node=spec.get("nodeName") or None, devices=tuple(devices))


@dataclass
class Catalogue:
    """The node-local devices of the cluster by class: how many each node has (`by_node`), how
    many of them are GPUs (`gpus`: selected by a class of `gpu_classes`), and which node and
    classes each device (driver, pool, device) counts for and whether it is a GPU (`where`).
    Only the newest generation of each pool counts (a driver republishing leaves old slices
    behind for a moment)."""

    by_node: dict[str, dict[str, float]] = field(default_factory=dict)
    gpus: dict[str, float] = field(default_factory=dict)
    where: dict[tuple[str, str, str], tuple[str, tuple[str, ...], bool]] = field(default_factory=dict)

    @classmethod
    def of(cls, slices: Iterable[SliceRecord], classes: Iterable[DeviceClassRecord],
           gpu_classes: frozenset[str] | None = None,
           refinements: Iterable[Refinement] = ()) -> Catalogue:
        """`refinements`: the (class, conditions) of requests narrowing their class
        (ClaimTemplateRecord.refinements), each counted as a resource of its own."""
        gpu_keys = {key(c) for c in (GPU_CLASSES if gpu_classes is None else gpu_classes)}
        readable = [c for c in classes if c.conditions is not None]
        narrowed: dict[str, list[tuple[str, tuple[Condition, ...]]]] = {}
        for class_name, conditions in set(refinements):
            narrowed.setdefault(class_name, []).append((refined_key(class_name, conditions), conditions))
        slices = list(slices)
        newest: dict[tuple[str, str], int] = {}
        for s in slices:
            newest[(s.driver, s.pool)] = max(newest.get((s.driver, s.pool), s.generation), s.generation)
        out = cls()
        for s in slices:
            if s.node is None or s.generation != newest[(s.driver, s.pool)]:
                continue
            on = out.by_node.setdefault(s.node, {})
            for name, attributes in s.devices:
                selecting = [c.name for c in readable if c.selects(s.driver, attributes)]
                keys = tuple(key(c) for c in selecting) + tuple(
                    k for c in selecting for k, conditions in narrowed.get(c, ())
                    if meets(conditions, s.driver, attributes))
                gpu = any(k in gpu_keys for k in keys)  # one GPU, whatever classes select it
                out.where[(s.driver, s.pool, name)] = (s.node, keys, gpu)
                for k in keys:
                    on[k] = on.get(k, 0.0) + 1.0
                if gpu:
                    out.gpus[s.node] = out.gpus.get(s.node, 0.0) + 1.0
        return out


# ---------------------------------------------------------------- ResourceClaimTemplates


@dataclass(frozen=True)
class ClaimTemplateRecord:
    name: str
    # (class, devices, the conditions of the request's own selectors) per request this module
    # counts.
    requests: tuple[tuple[str, int, tuple[Condition, ...]], ...] = ()

    @property
    def refinements(self) -> tuple[Refinement, ...]:
        return tuple((c, conditions) for c, _, conditions in self.requests if conditions)


def claim_template_record(body: Mapping[str, Any]) -> ClaimTemplateRecord:
    devices = (((body.get("spec") or {}).get("spec") or {}).get("devices") or {})
    requests = []
    for request in devices.get("requests") or ():
        exactly = (request or {}).get("exactly")
        if not isinstance(exactly, Mapping) or exactly.get("adminAccess"):
            continue
        if (exactly.get("allocationMode") or "ExactCount") != "ExactCount":
            continue
        conditions = selectors_conditions(exactly.get("selectors"))
        class_name = exactly.get("deviceClassName")
        if class_name and conditions is not None:
            requests.append((str(class_name), int(exactly.get("count") or 1), conditions))
    return ClaimTemplateRecord(name=(body.get("metadata") or {}).get("name", ""),
                               requests=tuple(requests))


def refinements(templates: Iterable[ClaimTemplateRecord]) -> frozenset[Refinement]:
    return frozenset(r for t in templates for r in t.refinements)


def claim_template_names(template: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The ResourceClaimTemplates a pod template's `resourceClaims` name (one claim each per
    pod); shared claims (`resourceClaimName`) are not counted."""
    spec = (template or {}).get("spec") if isinstance(template, Mapping) else None
    claims = spec.get("resourceClaims") if isinstance(spec, Mapping) else None
    return tuple(str(c["resourceClaimTemplateName"]) for c in claims or ()
                 if isinstance(c, Mapping) and c.get("resourceClaimTemplateName"))


def template_takes(names: Sequence[str], templates: Mapping[str, ClaimTemplateRecord],
                   classes: Mapping[str, DeviceClassRecord]) -> tuple[Counted, str | None]:
    """What one pod naming the claim templates `names` takes of each class it can be counted
    for, and why its pods cannot start (a template or class that does not exist), if so."""
    taken: dict[str, float] = {}
    for name in names:
        template = templates.get(name)
        if template is None:
            return (), f"name ResourceClaimTemplate {name!r}, which does not exist"
        for class_name, count, conditions in template.requests:
            device_class = classes.get(class_name)
            if device_class is None:
                return (), (f"claim devices of DeviceClass {class_name!r} (ResourceClaimTemplate "
                            f"{name!r}), which does not exist")
            if device_class.conditions is not None:
                k = refined_key(class_name, conditions)
                taken[k] = taken.get(k, 0.0) + count
    return tuple(sorted(taken.items())), None


# ---------------------------------------------------------------------- ResourceClaims


@dataclass(frozen=True)
class ClaimRecord:
    namespace: str
    name: str
    pod: str | None  # the pod it was made for (its owner), or None
    devices: tuple[tuple[str, str, str], ...] = ()  # allocated (driver, pool, device)


def resource_claim_record(body: Mapping[str, Any]) -> ClaimRecord | None:
    """None for a claim with nothing allocated."""
    meta = body.get("metadata") or {}
    allocation = ((body.get("status") or {}).get("allocation") or {}).get("devices") or {}
    devices = tuple((str(r.get("driver") or ""), str(r.get("pool") or ""), str(r.get("device") or ""))
                    for r in allocation.get("results") or () if isinstance(r, Mapping)
                    and not r.get("adminAccess"))
    if not devices:
        return None
    pod = next((o.get("name") for o in meta.get("ownerReferences") or ()
                if o.get("kind") == "Pod" and o.get("controller")), None)
    return ClaimRecord(namespace=meta.get("namespace", ""), name=meta.get("name", ""), pod=pod,
                       devices=devices)


def claimed(claims: Iterable[ClaimRecord], catalogue: Catalogue
            ) -> list[tuple[str, str | None, str, Counted, float]]:
    """(namespace, pod, node, devices taken per class, GPUs among them) of each allocated
    claim."""
    out = []
    for claim in claims:
        per_node: dict[str, dict[str, float]] = {}
        gpus: dict[str, float] = {}
        for device in claim.devices:
            found = catalogue.where.get(device)
            if found is None:
                continue
            node, keys, gpu = found
            on = per_node.setdefault(node, {})
            for k in keys:
                on[k] = on.get(k, 0.0) + 1.0
            gpus[node] = gpus.get(node, 0.0) + (1.0 if gpu else 0.0)
        for node, taken in per_node.items():
            out.append((claim.namespace, claim.pod, node, tuple(sorted(taken.items())), gpus[node]))
    return out


def gpus_of(taken: Counted, gpu_classes: frozenset[str] | None = None) -> float:
    """The GPUs among what one pod claims (template_takes), by `gpu_classes`."""
    gpu_keys = {key(c) for c in (GPU_CLASSES if gpu_classes is None else gpu_classes)}
    return sum(amount for name, amount in taken if class_key(name) in gpu_keys)

