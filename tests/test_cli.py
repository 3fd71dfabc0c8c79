import json
import subprocess
import sys

import pytest

from mlsched.cli import main

FIELDS = ["policy", "placement", "avg_jct_s", "p50_jct_s", "p95_jct_s", "makespan_s", "gpu_util",
          "cpu_util", "avg_slowdown", "ideal_avg_jct_s", "jobs", "completed"]


def test_simulate_json_prints_exactly_one_object_with_the_documented_fields(tmp_path):
    trace = tmp_path / "t.csv"
    assert main(["trace", "generate", "--jobs", "12", "--seed", "4", "--out", str(trace)]) == 0
    out = subprocess.run([sys.executable, "-m", "mlsched.cli", "simulate", "--trace", str(trace), "--nodes", "4",
                          "--policies", "drf,optimus", "--placement", "load-balance,bin-pack", "--json"],
                         capture_output=True, text=True, check=True).stdout
    doc = json.loads(out)  # exactly one JSON value, nothing else on stdout
    rows = doc["results"]
    assert [(r["policy"], r["placement"]) for r in rows] == [
        ("drf", "load-balance"), ("drf", "bin-pack"), ("optimus", "load-balance"), ("optimus", "bin-pack")]
    for r in rows:
        assert list(r)[:len(FIELDS)] == FIELDS
        assert r["jobs"] == r["completed"] == 12


def test_simulate_table_shows_ratios_and_writes_a_plot(tmp_path, capsys):
    plot = tmp_path / "jct.png"
    assert main(["simulate", "--nodes", "13", "--policies", "drf,optimus-oracle", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "1.00x" in out and "optimus-oracle" in out and "built-in" in out
    assert plot.stat().st_size > 10_000


def test_bad_trace_is_one_clear_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("name,arrival_s,model,epochs\na,0,resnet-50,10\nb,1,bert,5\n")
    assert main(["simulate", "--trace", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:3: unknown model 'bert'" in err and "Traceback" not in err


def test_unknown_policy_fails_before_simulating(capsys):
    assert main(["simulate", "--policies", "drf,magic"]) == 2
    assert "unknown allocation policy 'magic'" in capsys.readouterr().err


def test_trace_generate_to_stdout(capsys):
    assert main(["trace", "generate", "--jobs", "3", "--pattern", "uniform", "--rate", "3"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "name,arrival_s,model,epochs,arch,workers,ps" and len(lines) == 4


def _read_model(items, name="big", key="policy.onnx"):
    """What the operator's ConfigMap model reader makes of created `items`."""
    import asyncio

    from mlsched.formats.model_sources import read_configmap_model

    by_name = {i["metadata"]["name"]: i for i in items}

    async def read(namespace, cm):
        return by_name.get(cm)

    return asyncio.run(read_configmap_model(read, "ns", name, key, 64 << 20))


def test_model_configmap_prints_what_serves_a_model_whole_or_in_parts(tmp_path, capsys):
    from mlsched.cli import model_configmaps

    model, card = bytes(range(256)) * 12, b'{"algorithm": "x"}'
    (small,) = model_configmaps("m", "policy.onnx", model, card)  # fits: one, as kubectl would make it
    assert small["data"] == {"policy.card.json": card.decode()} and _read_model([small], "m").model == model
    items = model_configmaps("big", "policy.onnx", model, card, part_bytes=1000)
    assert [i["metadata"]["name"] for i in items] == ["big-part-1", "big-part-2", "big-part-3", "big-part-4", "big"]
    bundle = _read_model(items)
    assert (bundle.model, bundle.card) == (model, card) and "(4 parts)" in bundle.model_name
    # The command: a List on stdout (for `kubectl create -f -`), the card found beside the model.
    (tmp_path / "h.onnx").write_bytes(b"\x08" * 2_000_000)
    (tmp_path / "h.card.json").write_text('{"algorithm": "harmony"}')
    assert main(["model-configmap", "big", str(tmp_path / "h.onnx"), "--key", "harmony.onnx"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["kind"] == "List" and len(doc["items"]) == 4 and "3 parts, then big naming them" in captured.err
    assert _read_model(doc["items"], key="harmony.onnx").model == b"\x08" * 2_000_000


def test_model_configmap_without_a_card_says_so(tmp_path, capsys):
    (tmp_path / "m.onnx").write_bytes(b"x")
    assert main(["model-configmap", "m", str(tmp_path / "m.onnx")]) == 2
    err = capsys.readouterr().err
    assert "no model card" in err and "--card" in err


def _commands(parser, path=()):
    """Every command path of the `mlsched` parser: ("simulate",), ("trace", "generate"), ..."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield path + (name,)
                yield from _commands(sub, path + (name,))


def _help_exits_0(argv, capsys):
    import pytest

    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--help"])
    out = capsys.readouterr()
    assert exit_.value.code == 0, (argv, out.err)
    assert out.out.startswith("usage: mlsched"), (argv, out.out)


def test_every_command_prints_its_help_and_exits_0(capsys):
    from mlsched.cli import build_parser

    commands = list(_commands(build_parser()))
    assert {("simulate",), ("train",), ("retrain",), ("model-configmap",), ("trace",),
            ("trace", "generate")} <= set(commands)
    for argv in [(), *commands]:
        _help_exits_0(list(argv), capsys)


@pytest.mark.training  # the trainers import torch
def test_every_trainer_and_retrainer_prints_its_help_and_exits_0(capsys):
    """`mlsched train POLICY --help`, `mlsched retrain POLICY --help`: past the policy name every
    argument is the trainer's own (policy_models/*/train.py, policy_models/retrain/cli.py)."""
    from importlib.metadata import entry_points

    import pytest

    try:
        import torch  # noqa: F401
    except ImportError:
        pytest.fail("the trainers need torch: pip install -e '.[dev]' (or make dev)")
    runs = [(command, e.name) for command, group in (("train", "mlsched.trainers"), ("retrain", "mlsched.retrainers"))
            for e in entry_points(group=group)]
    assert {("retrain", "dl2"), ("retrain", "harmony"), ("train", "dl2")} <= set(runs)
    for command, policy in runs:
        _help_exits_0([command, policy], capsys)
