"""Nodes of the session's shared plane set up for one test: labelled, advertising other
allocatable amounts, and the pool of three nodes the counted-resource tests keep their workers
on. Each change is undone after the test."""

from __future__ import annotations

import contextlib

from kubernetes import client

DISK = "e2e.mlsched.io/disk"


@contextlib.contextmanager
def labelled(core: client.CoreV1Api, names: list[str], key: str, value: str):
    """Nodes of the session's shared plane labelled for one test, and unlabelled after it."""
    try:
        for name in names:
            core.patch_node(name, {"metadata": {"labels": {key: value}}})
        yield
    finally:
        for name in names:
            core.patch_node(name, {"metadata": {"labels": {key: None}}})


NIC = "example.com/nic"
POOL = "e2e.mlsched.io/counted"
NODES = ["kwok-node-4", "kwok-node-5", "kwok-node-6"]


@contextlib.contextmanager
def node_allocatable(core: client.CoreV1Api, names: list[str], **allocatable: str | None):
    """Nodes of the session's shared plane advertising other allocatable amounts for one test
    (as a kubelet or device plugin would), restored after it. Keys use `_` for `/` and `.`."""
    before = {}
    for name in names:
        status = core.read_node_status(name).status
        before[name] = {k: (status.allocatable or {}).get(k) for k in _keys(allocatable)}
    try:
        for name in names:
            amounts = dict(zip(_keys(allocatable), allocatable.values()))
            core.patch_node_status(name, {"status": {"capacity": amounts, "allocatable": amounts}})
        yield
    finally:
        for name, amounts in before.items():
            core.patch_node_status(name, {"status": {"capacity": amounts, "allocatable": amounts}})


def _keys(allocatable: dict) -> list[str]:
    return [NIC if k == "nic" else k for k in allocatable]


def small_workers(job: dict, *, cpu: str, nics: int = 0) -> dict:
    """Workers asking for `cpu`, 1Gi, no GPU (and `nics` NICs each), kept on the test's nodes."""
    spec = job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]
    want = {"cpu": cpu, "memory": "1Gi", **({NIC: str(nics)} if nics else {})}
    spec["containers"][0]["resources"] = {"requests": want, "limits": dict(want)}
    spec["nodeSelector"] = {POOL: "yes"}
    return job
