"""The operator as manifests/base/deployment.yaml ships it: the flags it starts with."""

from __future__ import annotations

from mlsched.controller.__main__ import parse_args
from mlsched_objects import REPO, load_yaml


def shipped_operator_args():
    """The flags manifests/base/deployment.yaml starts the operator with."""
    (deployment,) = load_yaml(REPO / "manifests" / "base" / "deployment.yaml")
    return parse_args(deployment["spec"]["template"]["spec"]["containers"][0]["args"])
