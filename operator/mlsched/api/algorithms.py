"""The algorithm names a SchedulingPolicy may give, per phase: the CRD's `enum`s.

The API server refuses any other name at `kubectl apply`, listing these (a typo like
`allocation: foobar` used to be stored and run as the fallback, `FallbackActive`). `api`
imports nothing of the scheduler, so the names are written here; tests/test_crds.py checks
they are exactly `mlsched.policies.registry`'s. Adding an algorithm to the registry therefore
means adding its name here and regenerating crds/ (`python -m mlsched.api.crdgen --out crds/`).
"""

from __future__ import annotations

ALLOCATION = ("fixed", "fifo", "srtf", "drf", "tetris", "optimus", "optimus-oracle",
              "drf-hetero", "optimus-hetero", "dl2", "chic", "chic-pair")
#: Allocations that need no model: what `fallback` may name (a learned fallback could itself
#: be unavailable when it is needed).
ALLOCATION_HEURISTICS = ("fixed", "fifo", "srtf", "drf", "tetris", "optimus", "optimus-oracle",
                         "drf-hetero", "optimus-hetero")
PLACEMENT = ("load-balance", "bin-pack", "first-fit", "tetris", "lif-line", "lif-quad", "tiresias",
             "harmony", "gpu-type-aware")
GROUPING = ("none", "isolated", "naive", "harmony")

BY_PHASE = {"allocation": ALLOCATION, "placement": PLACEMENT, "grouping": GROUPING}
