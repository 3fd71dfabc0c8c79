"""The interference model reproduces what the Harmony placement paper measured (§III)."""

import numpy as np
import pytest

from mlsched.workloads import catalog
from mlsched.workloads.interference import job_speed_factors, pair_slowdown

CTC = "cnn-text-classification"


def test_six_jobs_bin_packed_two_per_server_slow_down_about_a_third():
    pairs = [("resnet-50", "vgg-16"), ("resnext-110", CTC), ("seq2seq", "wlm")]
    slowdowns = [pair_slowdown(a, b) for a, b in pairs] + [pair_slowdown(b, a) for a, b in pairs]
    assert 0.28 <= np.mean(slowdowns) <= 0.38  # paper: 33 %


def test_resnext_is_nearly_two_times_slower_next_to_ctc():
    assert pair_slowdown("resnext-110", CTC) >= 0.45  # speed roughly halves


def test_resnext_with_wlm_or_seq2seq_interferes_little():
    assert pair_slowdown("resnext-110", "wlm") < 0.15
    assert pair_slowdown("resnext-110", "seq2seq") < 0.15


@pytest.mark.parametrize("victim", catalog.MODEL_NAMES)
def test_ctc_hurts_every_neighbour(victim):
    with_ctc = pair_slowdown(victim, CTC)
    others = [pair_slowdown(victim, n) for n in catalog.MODEL_NAMES if n != CTC]
    assert with_ctc >= 0.2
    assert with_ctc > np.mean(others)


def test_resnext_suffers_more_from_ctc_than_vgg_does():
    assert pair_slowdown("resnext-110", CTC) > pair_slowdown("vgg-16", CTC)


def test_more_ctc_neighbours_hurt_more():
    one = job_speed_factors({"a": ("resnext-110", [0]), "c1": (CTC, [0])})["a"]
    two = job_speed_factors({"a": ("resnext-110", [0]), "c1": (CTC, [0]), "c2": (CTC, [0])})["a"]
    assert two < one < 1


def test_alone_or_apart_there_is_no_interference():
    f = job_speed_factors({"a": ("resnet-50", [0, 0, 1]), "b": (CTC, [2, 3])})
    assert f == {"a": 1.0, "b": 1.0}
