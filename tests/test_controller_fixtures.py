"""Moved to tests/builders.py (a helper module, not a test module; issue 50): import from there.
This name stays only until no test imports it any more."""

from builders import *  # noqa: F401,F403
