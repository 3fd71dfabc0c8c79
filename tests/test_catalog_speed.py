import math

import numpy as np
import pytest

from mlsched.workloads import catalog, speed_models, speed_table


def test_catalog_has_the_eight_measured_models_and_the_ctc_alias():
    assert catalog.MODEL_NAMES == ("resnet-50", "vgg-16", "resnext-110", "inception-bn", "seq2seq",
                                   "cnn-text-classification", "dssm", "wlm")
    assert catalog.canonical_name("CTC") == "cnn-text-classification"
    assert catalog.get("vgg-16").model_size_mb == 553.4
    assert catalog.get("dssm").worker_demand[1] == 0  # CPU-only workers, as in DL²
    with pytest.raises(catalog.UnknownModelError, match="unknown model 'bert'"):
        catalog.canonical_name("bert")


def test_shipped_table_has_804_rows_and_9_failed_runs():
    # shared/data/README.md says 803: `wc -l` misses the last line, which has no newline.
    rows = speed_table.load_measurements()
    assert len(rows) == 804
    assert sum(1 for r in rows if r.speed == 0) == 9
    assert {r.model for r in rows} == set(catalog.MODEL_NAMES)


def test_measured_points_are_reproduced():
    for r in speed_table.load_measurements():
        if r.speed > 0:
            assert speed_table.table_speed(r.model, r.ps, r.workers) == pytest.approx(r.speed, rel=1e-9)


def test_failed_runs_are_filled_from_neighbours_not_zero():
    # vgg-16 at ps=4, workers=8 failed (speed 0 in the table).
    filled = speed_table.table_speed("vgg-16", 4, 8)
    neighbours = [speed_table.table_speed("vgg-16", p, w) for p, w in ((3, 8), (5, 8), (4, 7), (4, 9))]
    assert min(neighbours) * 0.5 < filled < max(neighbours) * 1.5


@pytest.mark.parametrize("model", catalog.MODEL_NAMES)
def test_between_and_beyond_the_grid_is_finite_and_positive(model):
    for ps in range(1, 40):
        for w in range(1, 40):
            s = speed_table.table_speed(model, ps, w)
            assert math.isfinite(s) and s > 0, (model, ps, w)


def test_between_grid_points_is_between_neighbours():
    # resnext-110 is measured at odd PS counts only; ps=2 lies between ps=1 and ps=3.
    a, b = speed_table.table_speed("resnext-110", 1, 1), speed_table.table_speed("resnext-110", 3, 1)
    assert min(a, b) <= speed_table.table_speed("resnext-110", 2, 1) <= max(a, b)


@pytest.mark.parametrize("model", catalog.MODEL_NAMES)
def test_zero_ps_or_zero_workers_trains_nothing(model):
    assert speed_table.table_speed(model, 0, 4) == 0
    assert speed_table.table_speed(model, 4, 0) == 0
    assert speed_models.MeasuredSpeed().steps_per_s(model, "allreduce", 0, 0) == 0


@pytest.mark.parametrize("model", catalog.MODEL_NAMES)
def test_optimus_fit_is_reasonable_and_reported(model):
    theta, err = speed_models.optimus_fit_to_table(model)
    assert (theta >= 0).all()
    assert err < 0.2  # mean relative error; the README lists each model's value


def test_optimus_fit_speed_model_is_swappable():
    fit = speed_models.get_speed_model("optimus-fit")
    measured = speed_models.get_speed_model("measured")
    a = fit.steps_per_s("resnet-50", "ps", 4, 4)
    b = measured.steps_per_s("resnet-50", "ps", 4, 4)
    assert a > 0 and a != b and abs(a - b) / b < 0.5
    with pytest.raises(ValueError, match="unknown speed model"):
        speed_models.get_speed_model("nope")


@pytest.mark.parametrize("model", catalog.MODEL_NAMES)
def test_ring_allreduce_is_grounded_in_the_table(model):
    ring = speed_models.ring_allreduce_steps_per_s
    assert ring(model, 1) == pytest.approx(max(speed_table.table_speed(model, p, 1) for p in range(1, 24)))
    best_two = max(speed_table.table_speed(model, p, 2) for p in range(1, 24))
    if best_two < 2 * ring(model, 1):
        assert ring(model, 2, nodes_spanned=2) == pytest.approx(best_two, rel=1e-6)
    else:  # a superlinear measurement (dssm): communication is floored, not negative
        assert ring(model, 1) < ring(model, 2, nodes_spanned=2) < 2 * ring(model, 1)
    assert ring(model, 2, nodes_spanned=1) >= ring(model, 2, nodes_spanned=2)  # intra-node is faster
    speeds = [ring(model, w) for w in range(1, 17)]
    assert all(np.isfinite(speeds)) and min(speeds) > 0
