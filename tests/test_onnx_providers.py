"""Where learned models run: CPU by default; CUDA only where it really starts, else a
ProviderUnavailable that says what to install, never a silent run on another device."""

from __future__ import annotations

import onnxruntime
import pytest

from mlsched.controller.serving import models
from mlsched.policies import registry
from mlsched.policies.onnx_runner import ProviderUnavailable, load_model


@pytest.fixture(scope="module")
def shipped_dl2() -> str:
    path = models.shipped_model("dl2")
    if path is None:
        pytest.fail("the shipped DL² artifact (policy_models/artifacts/dl2/) is missing")
    return path


def test_the_default_is_the_cpu(shipped_dl2):
    model = load_model(shipped_dl2, "dl2", "allocation")
    assert model.session.get_providers() == ["CPUExecutionProvider"]


def test_a_provider_missing_from_the_build_names_the_extra_to_install(shipped_dl2):
    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.fail("this test needs the CPU-only onnxruntime (the dev install); "
                    "onnxruntime-gpu is installed here")
    with pytest.raises(ProviderUnavailable, match=r"CUDA is not in this onnxruntime build "
                                                  r"\(install the gpu extra, onnxruntime-gpu"):
        load_model(shipped_dl2, "dl2", "allocation", provider="CUDA")


@pytest.mark.filterwarnings("ignore:Specified provider")
def test_a_provider_in_the_build_that_does_not_start_is_refused_not_run_on_the_cpu(
        shipped_dl2, monkeypatch):
    """onnxruntime-gpu on a machine without a usable GPU falls back to the CPU with only a
    log line; the runner checks which provider the session really got."""
    real = onnxruntime.get_available_providers()
    monkeypatch.setattr(onnxruntime, "get_available_providers",
                        lambda: ["CUDAExecutionProvider", *real])
    with pytest.raises(ProviderUnavailable, match="did not start"):
        load_model(shipped_dl2, "dl2", "allocation", provider="CUDA")


def test_an_unknown_provider_names_the_choices(shipped_dl2):
    with pytest.raises(ValueError, match="unknown execution provider 'TPU'; choose one of CPU, CUDA"):
        load_model(shipped_dl2, "dl2", "allocation", provider="TPU")


def test_the_registry_passes_the_provider_to_every_learned_allocation(shipped_dl2):
    for name in ("dl2", "chic", "chic-pair"):
        path = models.shipped_model(name)
        with pytest.raises(ProviderUnavailable):
            registry.make("allocation", name, registry.PolicyContext(
                model_path=path, execution_provider="CUDA"))
