"""Command-line options from a trainer's hyperparameter dataclass: one `--flag` per field
(underscores become dashes), a tuple field takes one or more values, a bool field is a switch
pair (`--flag` / `--no-flag`; `type=bool` would read "False" as true), defaults are the
dataclass's. Shared by `mlsched train dl2|chic|chic-pair|harmony`."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


def parse_into(cls: type[T], argv: list[str] | None, prog: str, doc: str | None,
               fixed: dict[str, Any] | None = None) -> T:
    """An instance of `cls` from `argv`; the fields in `fixed` get those values and no flag."""
    fixed = fixed or {}
    parser = argparse.ArgumentParser(prog=prog, description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    fields = [f for f in dataclasses.fields(cls) if f.name not in fixed]
    for f in fields:
        flag = "--" + f.name.replace("_", "-")
        if isinstance(f.default, tuple):
            kind = type(f.default[0]) if f.default else str
            parser.add_argument(flag, type=kind, nargs="+", default=f.default)
        elif isinstance(f.default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
        else:
            parser.add_argument(flag, type=type(f.default), default=f.default)
    ns = vars(parser.parse_args(argv))
    values = {f.name: tuple(ns[f.name]) if isinstance(f.default, tuple) else ns[f.name] for f in fields}
    return cls(**values, **fixed)
