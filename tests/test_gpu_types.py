"""GPU types (issue 54): the measured table, the cluster model, the simulator's pace, and the
heterogeneity-aware policies."""

import dataclasses

import pytest

from conftest import job, make_snapshot
from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import SpeedObservation
from mlsched.policies import gpu_speed, registry
from mlsched.policies.placement.heuristics import LoadBalance
from mlsched.policies.round import run_round
from mlsched.sim.simulator import SimConfig, Simulator
from mlsched.workloads import catalog, generators, gpu_types
from mlsched.workloads.traces import TraceJob


# ---- the table --------------------------------------------------------------------------
def test_every_catalog_model_has_a_ratio_per_type_with_the_v100_as_reference():
    for model in catalog.MODEL_NAMES:
        r = gpu_types.ratios(model)
        assert set(r) == set(gpu_types.GPU_TYPES)
        assert r["v100"] == 1.0
        assert 0 < r["k80"] <= r["p100"] <= r["v100"]


def test_the_mapped_models_take_gavels_measured_ratios():
    # simulation_throughputs.json: ResNet-50 (batch 32) 1.2366 / 4.8883 / 7.7873 steps/s
    assert gpu_types.ratios("resnet-50") == {"v100": 1.0, "p100": 0.628, "k80": 0.159}
    assert gpu_types.ratios("wlm")["k80"] == pytest.approx(6.0542 / 28.2400, abs=1e-3)
    assert gpu_types.ratios("resnext-110")["k80"] == pytest.approx(1.8065 / 17.9949, abs=1e-3)
    assert gpu_types.ratios("seq2seq")["p100"] == pytest.approx(5.0918 / 8.6178, abs=1e-3)
    assert set(gpu_types.GAVEL_JOB_TYPE) == {"resnet-50", "resnext-110", "seq2seq", "wlm"}


def test_models_without_a_counterpart_get_the_prior_and_cpu_only_models_ignore_the_type():
    for model in ("vgg-16", "inception-bn", "my-own-model"):
        assert gpu_types.ratios(model) == gpu_types.PRIOR
    for model in ("cnn-text-classification", "ctc", "dssm"):
        assert all(v == 1.0 for v in gpu_types.ratios(model).values())
    assert gpu_types.relative_speed("resnet-50", "k80", uses_gpu=False) == 1.0
    assert gpu_types.relative_speed("resnet-50", None) == 1.0


def test_a_job_spanning_types_runs_at_its_slowest_workers_pace():
    assert gpu_types.slowest("resnet-50", ["v100", "k80", "p100"]) == 0.159
    assert gpu_types.slowest("resnet-50", []) == 1.0
    assert gpu_types.slowest("resnet-50", [None, None]) == 1.0


def test_the_cluster_flag_parses_nodes_per_type():
    assert gpu_types.parse_cluster("v100:2, P100:1,k80:3") == ("v100", "v100", "p100", "k80", "k80", "k80")
    assert gpu_types.format_cluster(gpu_types.parse_cluster("v100:2,k80:1")) == "v100:2,k80:1"
    for bad in ("", "v100", "v100:x", "v100:0", "a100:2", "v100:1,v100:2"):
        with pytest.raises(ValueError):
            gpu_types.parse_cluster(bad)


def test_a_nodes_gpu_product_label_names_its_type():
    assert gpu_types.from_product_label("Tesla-V100-SXM2-16GB") == "v100"
    assert gpu_types.from_product_label("Tesla-P100-PCIE-16GB") == "p100"
    assert gpu_types.from_product_label("Tesla-K80") == "k80"
    assert gpu_types.from_product_label("NVIDIA-A100-SXM4-40GB") is None
    assert gpu_types.from_product_label(None) is None


# ---- the cluster model ------------------------------------------------------------------
def test_a_snapshot_has_one_type_per_node_or_none():
    snap = make_snapshot([], nodes=2)
    assert not snap.typed and snap.gpu_type(1) is None
    typed = dataclasses.replace(snap, gpu_types=("v100", "k80"))
    assert typed.typed and typed.gpu_type(1) == "k80"
    with pytest.raises(ValueError, match="one entry per node"):
        dataclasses.replace(snap, gpu_types=("v100",))


def test_the_ledger_tells_the_types_a_jobs_workers_got():
    snap = dataclasses.replace(make_snapshot([job("a")], nodes=2), gpu_types=("v100", "k80"))
    ledger = Ledger(snap, LoadBalance())
    a = snap.jobs[0]
    assert ledger.worker_types(a) == set()
    ledger.book(a, "worker", 0)
    ledger.book(a, "worker", 1)
    assert ledger.worker_types(a) == {"v100", "k80"} and ledger.gpu_type(1) == "k80"
    untyped = Ledger(make_snapshot([a], nodes=2), LoadBalance())
    untyped.book(a, "worker", 0)
    assert untyped.worker_types(a) == {None}


# ---- the simulator ----------------------------------------------------------------------
def _one_job(model="resnet-50"):
    return [TraceJob("j", 0.0, model, 1e6, "ps")]


def _rate(types, workers, model="resnet-50"):
    sim = Simulator(_one_job(model), SimConfig(nodes=len(types) if types else 3, interference=False,
                                               gpu_types=types))
    s = sim.states["j"]
    s.ps_nodes, s.worker_nodes = (0,), tuple(workers)
    return sim._rates()["j"]


def test_the_simulated_speed_is_the_slowest_workers_types():
    plain = _rate(None, (0, 1, 2))
    assert _rate(("v100", "v100", "v100"), (0, 1, 2)) == plain
    assert _rate(("v100", "p100", "k80"), (0, 1, 2)) == pytest.approx(plain * 0.159)
    assert _rate(("v100", "p100", "k80"), (0, 1)) == pytest.approx(_rate(None, (0, 1)) * 0.628)
    # CPU-only workers: the GPU type of the node does not matter
    assert _rate(("k80", "k80", "k80"), (0, 1), "dssm") == _rate(None, (0, 1), "dssm")


def test_a_step_keeps_a_slower_gpu_busy_for_longer():
    def busy(types):
        sim = Simulator(_one_job(), SimConfig(nodes=2, gpu_types=types))
        s = sim.states["j"]
        s.ps_nodes, s.worker_nodes = (0,), (0, 1)
        return sim.pace.busy_per_step(s).compute_s

    assert busy(("v100", "v100")) == busy(None)
    assert busy(("v100", "k80")) == pytest.approx(busy(None) / 0.159)


def test_a_typed_simulator_records_the_type_each_speed_was_measured_at():
    types = ("v100", "k80")
    sim = Simulator(_one_job(), SimConfig(nodes=2, gpu_types=types))
    snap = sim.snapshot()
    assert snap.gpu_types == types
    j = snap.jobs[0]
    assert len(j.observation_types) == len(j.observations) and set(j.observation_types) == {"v100"}
    sim.advance(run_round(snap, registry.make_allocation("drf"), registry.make_placement("gpu-type-aware")))
    j = sim.snapshot().jobs[0]
    assert len(j.observation_types) == len(j.observations)
    with pytest.raises(ValueError, match="2 nodes"):
        Simulator(_one_job(), SimConfig(nodes=3, gpu_types=types))


def _jcts(trace, nodes, alloc, place, types):
    sim = Simulator(trace, SimConfig(nodes=nodes, seed=3, gpu_types=types))
    ctx = registry.PolicyContext(speed_model=sim.speed)
    r = sim.run(registry.make_allocation(alloc, ctx), registry.make_placement(place, ctx))
    return r.jct_s, r.summary()


@pytest.mark.parametrize("alloc, place", [("drf", "load-balance"), ("optimus", "load-balance"),
                                          ("optimus-oracle", "tetris"), ("fifo", "bin-pack")])
def test_a_homogeneous_cluster_decides_the_same_with_and_without_one_type_set(alloc, place):
    trace = generators.generate(jobs=30, rate=4, seed=5, arch_mix=0.3)
    untyped = _jcts(trace, 5, alloc, place, None)
    one_type = _jcts(trace, 5, alloc, place, ("v100",) * 5)
    assert one_type[0] == untyped[0]  # every job's JCT, to the bit


@pytest.mark.parametrize("hetero, agnostic", [("drf-hetero", "drf"), ("optimus-hetero", "optimus")])
def test_on_an_untyped_cluster_the_hetero_policies_are_their_agnostic_versions(hetero, agnostic):
    trace = generators.generate(jobs=30, rate=4, seed=6)
    assert _jcts(trace, 5, hetero, "gpu-type-aware", None)[0] == \
        _jcts(trace, 5, agnostic, "load-balance", None)[0]


# ---- the policies -----------------------------------------------------------------------
def _typed(jobs, types):
    return dataclasses.replace(make_snapshot(jobs, nodes=len(types)), gpu_types=tuple(types))


def _types_of(snap, d, name):
    return {snap.gpu_types[n] for n in d.jobs[name].worker_nodes}


@pytest.mark.parametrize("alloc", ["drf-hetero", "optimus-hetero"])
def test_hetero_policies_keep_a_job_on_one_type_the_fastest_with_room(alloc):
    snap = _typed([job("a", max_workers=4, max_ps=4)], ["k80", "k80", "v100", "v100", "p100", "p100"])
    d = run_round(snap, registry.make_allocation(alloc), registry.make_placement("gpu-type-aware"))
    assert _types_of(snap, d, "a") == {"v100"}
    assert d.counts("a")[1] >= (2 if alloc == "drf-hetero" else 1)  # (optimus: no speeds seen)


def test_agnostic_load_balance_spreads_a_job_over_types():
    snap = _typed([job("a", max_workers=4, max_ps=4)], ["k80", "k80", "v100", "v100", "p100", "p100"])
    d = run_round(snap, registry.make_allocation("drf"), registry.make_placement("load-balance"))
    assert len(_types_of(snap, d, "a")) > 1  # what the hetero placement avoids


def test_when_the_fastest_type_is_full_a_job_takes_the_next_and_stays_there():
    first = job("first", arrival=0, max_workers=2, max_ps=1)
    second = job("second", arrival=1, max_workers=3, max_ps=1)
    snap = _typed([first, second], ["v100", "p100", "p100", "k80"])
    d = run_round(snap, registry.make_allocation("drf-hetero"), registry.make_placement("gpu-type-aware"))
    assert _types_of(snap, d, "first") == {"v100"}
    assert _types_of(snap, d, "second") == {"p100"}


def test_the_type_aware_placement_sticks_to_a_running_jobs_nodes_of_its_type():
    a = job("a", max_workers=2, max_ps=2, ps=1, workers=2, ps_nodes=(1,), worker_nodes=(1, 1))
    snap = _typed([a], ["v100", "v100", "k80"])
    d = run_round(snap, registry.make_allocation("drf-hetero"), registry.make_placement("gpu-type-aware"))
    assert d.jobs["a"].worker_nodes == [1, 1]


def test_a_job_takes_the_type_where_it_would_train_fastest_not_one_slot_on_the_fastest():
    # The V100 node has room for one worker of the second job; two P100 nodes have four.
    first = job("first", arrival=0, max_workers=1, max_ps=1)
    second = job("second", arrival=1, max_workers=4, max_ps=4)
    snap = _typed([first, second], ["v100", "p100", "p100"])
    d = run_round(snap, registry.make_allocation("drf-hetero"), registry.make_placement("gpu-type-aware"))
    assert _types_of(snap, d, "first") == {"v100"}
    assert _types_of(snap, d, "second") == {"p100"} and d.counts("second")[1] >= 2


def test_hetero_drf_counts_a_slow_gpu_for_less():
    from mlsched.policies.allocation.hetero import HeteroDRF

    a, b = job("a", arrival=0), job("b", arrival=1)
    snap = _typed([a, b], ["v100", "k80", "k80", "k80"])
    ledger = Ledger(snap, LoadBalance())
    for j, node in ((a, 0), (b, 1)):
        ledger.book(j, "ps", node)
        ledger.book(j, "worker", node)
    whole = 2 * (1.0 + 3 * 0.159)  # the cluster's GPUs in V100s, for resnet-50
    assert HeteroDRF.share(ledger, a) == pytest.approx(max(4 / 32, 1 / whole))
    assert HeteroDRF.share(ledger, b) == pytest.approx(max(4 / 32, 0.159 / whole))
    assert HeteroDRF.share(ledger, b) < HeteroDRF.share(ledger, a)


def test_observed_speeds_are_normalised_to_the_reference_type():
    a = job("a", observations=(SpeedObservation(1, 1, 0.159), SpeedObservation(1, 2, 0.3)),
            observation_types=("k80", "v100"))
    n = gpu_speed.normalised(a)
    assert [o.epochs_per_s for o in n.observations] == [pytest.approx(1.0), 0.3]
    assert gpu_speed.normalised(job("b")) is not None
    mismatched = dataclasses.replace(a, observation_types=("k80",))
    assert gpu_speed.normalised(mismatched) is mismatched


def test_the_hetero_policies_are_registered():
    assert registry.known("allocation", "drf-hetero") and registry.known("allocation", "optimus-hetero")
    assert registry.known("placement", "gpu-type-aware")


# ---- mlsched simulate --gpu-types --------------------------------------------------------
def test_simulate_takes_a_heterogeneous_cluster(tmp_path, capsys):
    import json

    from mlsched.cli import main
    from mlsched.workloads import traces

    trace = tmp_path / "t.csv"
    traces.write(generators.generate(jobs=8, rate=4, seed=2), trace)
    assert main(["simulate", "--trace", str(trace), "--gpu-types", "v100:1,p100:1,k80:1",
                 "--policies", "drf-hetero,drf", "--placement", "gpu-type-aware", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["nodes"] == 3 and len(out["results"]) == 2
    assert main(["simulate", "--trace", str(trace), "--gpu-types", "a100:2"]) == 2
    assert "unknown GPU type" in capsys.readouterr().err


def test_simulate_warns_when_a_type_aware_allocation_runs_with_a_type_blind_placement(tmp_path, capsys):
    """drf-hetero with the default load-balance placement: a job's workers spread over types
    (1.37 x drf's average JCT on the built-in trace with v100:4,p100:4,k80:4 when this was
    written), so the user is told which placement it needs; the right pairing is not warned."""
    from mlsched.cli import main
    from mlsched.workloads import traces

    trace = tmp_path / "t.csv"
    traces.write(generators.generate(jobs=4, rate=4, seed=2), trace)
    assert main(["simulate", "--trace", str(trace), "--gpu-types", "v100:1,k80:1",
                 "--policies", "drf-hetero,drf", "--json"]) == 0
    err = capsys.readouterr().err
    assert "drf-hetero with --placement load-balance" in err and "--placement gpu-type-aware" in err
    assert "warning: drf " not in err  # the agnostic allocation is not warned about
    assert main(["simulate", "--trace", str(trace), "--gpu-types", "v100:1,k80:1",
                 "--policies", "drf-hetero", "--placement", "gpu-type-aware", "--json"]) == 0
    assert "warning" not in capsys.readouterr().err


def _shown(model, readings):
    """A job of `model` that showed `readings`: (type, speed over its prior curve's) pairs."""
    base = job("x", model=model)
    speed = base.prior.speed_function()(1, 1)
    return dataclasses.replace(
        base, observations=tuple(SpeedObservation(1, 1, f * speed) for _, f in readings),
        observation_types=tuple(t for t, _ in readings))


def test_a_model_outside_the_table_corrects_the_priors_ratios_from_the_speeds_it_shows():
    """Issue 54: a model with no measured ratios (VGG-16: no Gavel counterpart) starts from the prior (K80 0.209 x a V100);
    once it has shown speeds on two types (twice each), what it showed wins: here a K80 at
    0.6 x its V100 speed. The policies see it (placement, hetero DRF's share, the typed DL²
    state all read gpu_speed / speed_fit.type_speed), and its speeds are normalised by it."""
    prior = gpu_types.PRIOR["k80"]
    fresh = _shown("vgg-16", [])
    assert gpu_speed.relative_speed(fresh, "k80") == prior
    once = _shown("vgg-16", [("v100", 1.0), ("k80", 0.6)])  # one reading each: noise
    assert gpu_speed.relative_speed(once, "k80") == prior
    shown = _shown("vgg-16", [("v100", 1.0), ("k80", 0.6), ("v100", 1.0), ("k80", 0.6)])
    assert gpu_speed.relative_speed(shown, "k80") == pytest.approx(0.6)
    assert gpu_speed.relative_speed(shown, "v100") == pytest.approx(1.0)
    assert gpu_speed.relative_speed(shown, "p100") == gpu_types.PRIOR["p100"]  # never seen there
    assert gpu_speed.pace(shown, {"v100", "k80"}) == pytest.approx(0.6)
    # Normalised, every reading is the V100's: one fit serves both types.
    speeds = [o.epochs_per_s for o in gpu_speed.normalised(shown).observations]
    assert max(speeds) == pytest.approx(min(speeds))
    # Without the reference type: the ratio between the types is what it showed.
    no_ref = _shown("vgg-16", [("p100", 0.5), ("k80", 0.4), ("p100", 0.5), ("k80", 0.4)])
    assert (gpu_speed.relative_speed(no_ref, "k80") / gpu_speed.relative_speed(no_ref, "p100")
            == pytest.approx(0.8))


def test_measured_models_keep_the_tables_ratios_whatever_they_show():
    shown = _shown("resnet-50", [("v100", 1.0), ("k80", 0.6), ("v100", 1.0), ("k80", 0.6)])
    assert gpu_speed.relative_speed(shown, "k80") == gpu_types.ratios("resnet-50")["k80"]
    cpu = _shown("dssm", [("v100", 1.0), ("k80", 0.6), ("v100", 1.0), ("k80", 0.6)])
    assert gpu_speed.relative_speed(cpu, "k80") == 1.0


def test_hetero_drf_counts_a_corrected_slow_gpu_for_what_it_showed():
    from mlsched.policies.allocation.hetero import HeteroDRF

    shown = _shown("vgg-16", [("v100", 1.0), ("k80", 0.6), ("v100", 1.0), ("k80", 0.6)])
    snap = _typed([shown], ["v100", "k80"])
    ledger = Ledger(snap, LoadBalance())
    ledger.book(snap.jobs[0], "worker", 1)
    whole = 2 * (1.0 + 0.6)  # two GPUs a node, in V100s for this job
    assert HeteroDRF.share(ledger, snap.jobs[0]) == pytest.approx(max(2 / 16, 0.6 / whole))
