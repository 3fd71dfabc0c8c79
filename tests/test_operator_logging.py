"""What the operator's log lines look like (`--log-format`), as `kubectl logs` shows them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

EMIT = """
import logging, sys
from mlsched.controller.__main__ import configure_logging, parse_args
args = parse_args(sys.argv[1:])
configure_logging(args.log_format, args.verbose)
logging.getLogger("mlsched.loop").info("policy team-a/default round 3: 2 jobs")
logging.getLogger("mlsched.loop").warning("a model file is missing")
logging.getLogger("kopf.objects").info("Handler 'x' succeeded.")
"""


def _log(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", EMIT, *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=60)


def test_by_default_each_line_carries_its_time_and_level():
    done = _log()
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 2, lines  # kopf's per-object successes stay out unless --verbose
    stamp = r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\] mlsched\.loop +"
    assert re.match(stamp + r"\[INFO +\] policy team-a/default round 3: 2 jobs$", lines[0]), lines
    assert re.match(stamp + r"\[WARNING +\] a model file is missing$", lines[1]), lines


def test_json_gives_one_object_a_line_with_time_and_severity():
    done = _log(env={"MLSCHED_LOG_FORMAT": "json"})
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stderr.splitlines()]
    assert [(r["severity"], r["message"]) for r in records] == [
        ("info", "policy team-a/default round 3: 2 jobs"), ("warn", "a model file is missing")]
    assert all(re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", r["timestamp"]) for r in records)


def test_plain_is_the_message_alone_and_the_flag_beats_the_environment():
    done = _log("--log-format", "plain", env={"MLSCHED_LOG_FORMAT": "json"})
    assert done.stderr.splitlines() == ["policy team-a/default round 3: 2 jobs",
                                        "a model file is missing"]


def test_an_unknown_format_stops_the_start_saying_which_are_known():
    flag = subprocess.run([sys.executable, "-m", "mlsched.controller", "--log-format", "xml"],
                          capture_output=True, text=True, timeout=60)
    assert flag.returncode == 2
    assert "argument --log-format: invalid choice: 'xml'" in flag.stderr
    env = subprocess.run([sys.executable, "-m", "mlsched.controller"], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "MLSCHED_LOG_FORMAT": "xml"})
    assert env.returncode == 2
    assert "MLSCHED_LOG_FORMAT='xml': choose one of full, json, plain" in env.stderr
