"""A learned model's domain (issue 51, part 1): the card records the setting its training
used (policy_models/domain.py), policies/model_domain.py checks a round against it, and
`mlsched simulate` warns when a learned policy runs outside it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from mlsched.cluster.types import JobView, Snapshot
from mlsched.cli import main
from mlsched.features.card import ModelCard
from mlsched.policies.model_domain import (
    Domain, DomainTally, Outside, RoundShape, check, describe, served_cards, shape_of,
)
from mlsched.sim import chic_scenario, compare
from mlsched.sim.simulator import SimConfig
from mlsched.workloads import generators
from policy_models import domain as trained

ARTIFACTS = Path(__file__).resolve().parents[1] / "policy_models" / "artifacts"
CHIC = Domain.from_json({"nodes": {"min": 1, "max": 1}, "node_gpus": {"min": 10, "max": 10},
                         "node_cpus": {"min": 120, "max": 120}, "jobs_present": {"min": 0, "max": 30},
                         "models": ["resnet-50", "vgg-16"], "architectures": ["ps"]})


def shape(nodes=1, gpus=10.0, cpus=120.0, jobs=3, models=("resnet-50",), archs=("ps",)) -> RoundShape:
    return RoundShape(nodes, (gpus,) * nodes, (cpus,) * nodes, jobs, frozenset(models), frozenset(archs))


def test_the_setting_trained_for_is_inside():
    assert check(CHIC, shape()) == []


def test_each_figure_outside_is_named_with_its_value_and_trained_range():
    found = check(CHIC, shape(nodes=30, gpus=2, cpus=8, jobs=61, models=("bert", "vgg-16"),
                              archs=("allreduce", "ps")))
    assert found == [Outside("nodes", "30", "1–1"), Outside("node GPUs", "2", "10–10"),
                     Outside("node CPUs", "8", "120–120"), Outside("jobs", "61", "0–30"),
                     Outside("models", "bert", "resnet-50, vgg-16"),
                     Outside("architectures", "allreduce", "ps")]
    assert describe(found[:2]) == "nodes 30 outside trained 1–1; node GPUs 2 outside trained 10–10"


def test_sizes_are_tolerated_from_half_the_smallest_to_twice_the_largest():
    dl2 = Domain.from_json({"nodes": {"min": 13, "max": 500}})
    assert check(dl2, shape(nodes=7)) == [] and check(dl2, shape(nodes=1000)) == []
    assert check(dl2, shape(nodes=6))[0].value == "6"
    assert check(dl2, shape(nodes=1001))[0].value == "1001"
    assert check(CHIC, shape(gpus=5, cpus=240, jobs=60)) == []
    assert [o.what for o in check(CHIC, shape(gpus=4.9, cpus=241))] == ["node GPUs", "node CPUs"]


def test_a_mixed_cluster_names_only_the_node_shapes_outside():
    mixed = RoundShape(2, (10.0, 0.0), (120.0, 16.0), 1, frozenset(), frozenset())
    assert check(CHIC, mixed) == [Outside("node GPUs", "0", "10–10"), Outside("node CPUs", "16", "120–120")]


def test_a_card_without_a_domain_has_none_and_partial_domains_check_what_they_say():
    assert Domain.from_json({}) is None and Domain.from_json(None) is None
    only_nodes = Domain.from_json({"nodes": {"min": 4, "max": 4}, "window": 3})
    assert check(only_nodes, shape(nodes=4, gpus=1, jobs=500, models=("anything",))) == []


def test_gpu_types_outside_training_are_named_and_untyped_training_means_untyped_only():
    """Issue 54: a model trained on untyped clusters (every card without `gpu_types`) served
    on a typed one is outside its domain; a typed model is inside on its types and on an
    untyped cluster (every GPU alike, as a cluster of the reference type)."""
    typed_shape = RoundShape(3, (2.0,) * 3, (8.0,) * 3, 1, frozenset(), frozenset(),
                             frozenset({"v100", "k80"}))
    untyped = Domain.from_json({"nodes": {"min": 1, "max": 10}})
    assert check(untyped, typed_shape) == [Outside("GPU types", "k80, v100", "none (untyped clusters)")]
    typed = Domain.from_json({"nodes": {"min": 1, "max": 10}, "gpu_types": ["v100", "p100"]})
    assert check(typed, typed_shape) == [Outside("GPU types", "k80", "p100, v100")]
    assert check(typed, dataclasses.replace(typed_shape, gpu_types=frozenset())) == []
    snap = Snapshot(0.0, 1200.0, ["n0", "n1"], np.array([[8.0, 2.0, 48.0]] * 2), [],
                    gpu_types=("v100", None))
    assert shape_of(snap).gpu_types == frozenset({"v100"})


def test_shape_of_a_snapshot_counts_nodes_shapes_and_jobs_waiting_or_running():
    jobs = [JobView("a", "resnet-50", "ps", 0.0, 10.0, workers=1, ps=1),
            JobView("b", "vgg-16", "allreduce", 5.0, 10.0)]
    snap = Snapshot(0.0, 1200.0, ["n0", "n1"], np.array([[8.0, 2.0, 48.0], [16.0, 4.0, 64.0]]), jobs)
    assert shape_of(snap) == RoundShape(2, (2.0, 4.0), (8.0, 16.0), 2, frozenset({"resnet-50", "vgg-16"}),
                                        frozenset({"ps", "allreduce"}))


@pytest.mark.parametrize("card", sorted(ARTIFACTS.glob("*/*.card.json")), ids=lambda p: p.name)
def test_every_shipped_card_records_the_domain_its_training_used(card):
    raw = json.loads(card.read_text())
    dom = raw["domain"]
    assert Domain.from_json(dom) is not None
    args = raw["training"].get("args") or json.loads(
        (ARTIFACTS / "dl2" / "dl2.card.json").read_text())["training"]["args"]  # dl2-sl: same run
    expected = {"chic": trained.chic, "chic-pair": trained.chic, "dl2": trained.dl2,
                "harmony": trained.harmony}[raw["algorithm"]](args)
    expected["simulator_version"] = raw["training"]["simulator_version"]
    assert {k: v for k, v in dom.items() if k != "sources"} == \
        {k: v for k, v in expected.items() if k != "sources"}
    assert dom["sources"]["nodes"]  # says where the figure came from


def test_the_shipped_domains_are_what_their_training_used():
    chic = json.loads((ARTIFACTS / "chic" / "chic.card.json").read_text())["domain"]
    cfg = chic_scenario.config()
    assert (chic["nodes"], chic["node_gpus"]["max"], chic["node_cpus"]["max"], chic["window"]) == (
        {"min": 1, "max": 1}, cfg.node_gpus, cfg.node_cpus, 3)
    assert chic["arrivals_per_hour"] == {"min": 0.9, "max": 2.7}
    assert chic["models"] == sorted(chic_scenario.MODELS) and chic["architectures"] == ["ps"]
    dl2 = json.loads((ARTIFACTS / "dl2" / "dl2.card.json").read_text())["domain"]
    assert dl2["nodes"] == {"min": 13, "max": 500} and dl2["window"] == 40
    assert dl2["simulator_version"] == "sim-1"
    holdout = json.loads((ARTIFACTS / "dl2-holdout" / "dl2-holdout.card.json").read_text())["domain"]
    assert "vgg-16" not in holdout["models"] and "dssm" not in holdout["models"]
    harmony = json.loads((ARTIFACTS / "harmony" / "harmony.card.json").read_text())["domain"]
    assert harmony["nodes"] == {"min": 6, "max": 30}
    assert harmony["architectures"] == ["allreduce", "ps"]


@pytest.mark.training  # exports a torch network
def test_a_new_export_writes_the_domain(tmp_path):
    from policy_models.chic import export, networks, train

    args = train.Args()
    path = tmp_path / "chic.onnx"
    export.export(networks.ChicNet(3, False).eval(), "chic", 3, False, path, training={},
                  validation={}, domain=trained.chic(vars(args)))
    card = ModelCard.read(tmp_path / "chic.card.json")
    assert card.domain["nodes"] == {"min": 1, "max": 1} and card.domain["window"] == 3


def test_a_retrained_domain_widens_its_base_by_the_recorded_cluster():
    base = trained.dl2({"train_nodes": [13, 60], "window": 40})
    wide = trained.widened(base, 100, {"bert"}, {"allreduce"}, "retrained on 5 intervals")
    assert wide["nodes"] == {"min": 13, "max": 100}
    assert "bert" in wide["models"] and wide["architectures"] == ["allreduce", "ps"]
    assert wide["sources"]["retrained"] == "retrained on 5 intervals"
    assert trained.widened({}, 100, (), (), "x") == {}  # the base's domain unknown: still unknown


def test_the_tally_of_a_run_keeps_the_first_value_outside_per_model_and_figure():
    card = ModelCard.read(ARTIFACTS / "chic" / "chic.card.json")

    class Learned:
        name = "chic"

    Learned.card = card
    tally = DomainTally.of(served_cards(None, Learned(), object()))
    tally.add(shape())
    tally.add(shape(nodes=30, gpus=2, cpus=8))
    tally.add(shape(nodes=40, gpus=2, cpus=8))
    assert (tally.rounds, tally.outside_rounds, tally.unknown) == (3, 2, ())
    assert tally.outside() == ("allocation chic: nodes 30 outside trained 1–1; node GPUs 2 outside "
                               "trained 10–10; node CPUs 8 outside trained 120–120")
    assert DomainTally.of([]).rounds == 0


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("domain") / "t.csv"
    assert main(["trace", "generate", "--jobs", "20", "--seed", "3", "--models", "resnet-50,vgg-16",
                 "--out", str(path)]) == 0
    return path


def test_simulate_warns_when_chic_runs_on_30_nodes(trace_file, capsys):
    assert main(["simulate", "--trace", str(trace_file), "--nodes", "30", "--policies", "chic,drf"]) == 0
    out = capsys.readouterr().out
    assert ("WARNING chic / load-balance: outside its model's trained domain in" in out
            and "allocation chic: nodes 30 outside trained 1–1; node GPUs 2 outside trained 10–10; "
                "node CPUs 8 outside trained 120–120" in out)
    assert "drf / load-balance" in out and "WARNING drf" not in out


def test_simulate_is_quiet_where_chic_was_trained():
    cfg = chic_scenario.config(0, event_driven=False)
    [run] = compare.run_pairs(chic_scenario.trace(1.8, 7), cfg, ["chic"], ["load-balance"])
    assert run.result.domain_rounds > 0 and run.result.rounds_outside_domain == 0
    assert "every round inside its model's trained domain" in compare.format_table([run])
    [drf] = compare.run_pairs(generators.generate(jobs=5, seed=1), SimConfig(nodes=4), ["drf"], ["load-balance"])
    assert drf.result.domain_rounds == 0 and "model domain" not in compare.format_table([drf])


def test_a_learned_model_without_a_domain_is_reported_unchecked(tmp_path):
    raw = json.loads((ARTIFACTS / "chic" / "chic.card.json").read_text())
    del raw["domain"]  # as a user's own model's card
    model = tmp_path / "chic.onnx"
    model.write_bytes((ARTIFACTS / "chic" / "chic.onnx").read_bytes())
    (tmp_path / "chic.card.json").write_text(json.dumps(raw))
    [run] = compare.run_pairs(generators.generate(jobs=4, seed=2, models=("resnet-50",)), SimConfig(nodes=30),
                              ["chic"], ["load-balance"], model_path=str(model))
    assert run.result.no_domain == ("allocation chic",) and run.result.rounds_outside_domain == 0
    assert ("chic / load-balance: the model card of allocation chic records no training domain"
            in compare.format_table([run]))
