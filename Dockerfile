# The mlsched operator image: the runtime package and the shipped ONNX models, no torch
# (learned policies are served with onnxruntime). Build from the repository root:
#
#   docker build -t mlsched-operator:latest .
#
# The retraining Job's image (`mlsched retrain`, with torch) is a second target:
#
#   docker build --target train -t mlsched-train:latest .
#
# For NVIDIA GPUs (onnxruntime-gpu, the package the model cards name for CUDA, on a CUDA
# runtime base whose Python is 3.12):
#
#   docker build -t mlsched-operator:latest-cuda \
#     --build-arg BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 \
#     --build-arg ONNXRUNTIME=onnxruntime-gpu .
#
# Both stages start from BASE_IMAGE, so the virtual environment built in the first stage
# finds the same Python at the same path in the second. The result runs as uid 10001 with a
# read-only root filesystem: nothing is written outside /tmp (an emptyDir in the Deployment).

# Pinned to a patch release and a Debian release, so a rebuild gets the same Python.
ARG BASE_IMAGE=python:3.11.14-slim-bookworm
# Where the torch of the retraining and training images comes from: torch's CPU wheels, not
# the default index's Linux wheels with gigabytes of CUDA libraries these images never use.
# e2e/build_images.sh builds where only PyPI is reachable and passes https://pypi.org/simple.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
# torch's test helpers hold files for newer Pythons (torch 2.15's
# testing/_internal/py312_intrinsics.py is 3.12 syntax): compileall stops at them, and
# nothing here imports them.
ARG TORCH_NOT_COMPILED=/torch/testing/

# ---------------------------------------------------------------------------- build stage
FROM ${BASE_IMAGE} AS build
ARG ONNXRUNTIME=onnxruntime
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The python images have python3 and venv; a CUDA base has neither.
# hadolint ignore=DL3008
RUN if ! python3 -m venv --help >/dev/null 2>&1; then \
      apt-get update \
      && apt-get install -y --no-install-recommends python3 python3-venv \
      && rm -rf /var/lib/apt/lists/*; \
    fi

WORKDIR /build
COPY pyproject.toml README.md ./
# The dependencies pyproject.toml names first, in a layer of their own: an edit to the code
# then reinstalls only mlsched, not kopf, onnxruntime and the rest.
# The CPU onnxruntime is a dependency of mlsched; the GPU build swaps it for onnxruntime-gpu
# of the same version (both install the module `onnxruntime`, so they must not coexist).
RUN python3 -m venv /opt/mlsched \
 && /opt/mlsched/bin/python -c "import tomllib; print('\n'.join(tomllib.load(open( \
      'pyproject.toml', 'rb'))['project']['dependencies']))" > requirements.txt \
 && /opt/mlsched/bin/pip install -r requirements.txt \
 && if [ "$ONNXRUNTIME" != onnxruntime ]; then \
      version="$(/opt/mlsched/bin/pip show onnxruntime | sed -n 's/^Version: //p')" \
      && /opt/mlsched/bin/pip uninstall -y onnxruntime \
      && /opt/mlsched/bin/pip install "$ONNXRUNTIME==$version"; \
    fi
COPY operator ./operator
# policy_models carries the shipped ONNX artifacts and their model cards: the default model of
# a learned policy whose SchedulingPolicy names no file. Its torch code is never imported.
COPY policy_models ./policy_models
# Bytecode is compiled here because the running container cannot write it.
RUN /opt/mlsched/bin/pip install --no-deps . \
 && /opt/mlsched/bin/python -c "import onnxruntime, mlsched.controller" \
 && ! /opt/mlsched/bin/python -c "import torch" 2>/dev/null \
 && /opt/mlsched/bin/python -m compileall -q /opt/mlsched

# ------------------------------------------------------------- retraining: build stage
# `--target train` (below) is the image of the retraining Job (manifests/retraining): the
# same environment plus the `train` extra. torch comes from its CPU wheel index: the default
# index's Linux wheels bring gigabytes of CUDA libraries the Job never uses.
FROM build AS build-train
ARG TORCH_INDEX
ARG TORCH_NOT_COMPILED
RUN /opt/mlsched/bin/pip install --index-url "$TORCH_INDEX" "torch>=2.3" \
 && /opt/mlsched/bin/pip install ".[train]" \
 && /opt/mlsched/bin/python -c "import torch, onnx, policy_models.retrain.cli" \
 && /opt/mlsched/bin/python -m compileall -q -x "$TORCH_NOT_COMPILED" /opt/mlsched

# ---------------------------------------------- retraining image: docker build --target train
#   docker build --target train -t mlsched-train:latest .
FROM ${BASE_IMAGE} AS train
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# hadolint ignore=DL3008
RUN if ! command -v python3 >/dev/null; then \
      apt-get update \
      && apt-get install -y --no-install-recommends python3 \
      && rm -rf /var/lib/apt/lists/*; \
    fi
COPY --from=build-train /opt/mlsched /opt/mlsched
RUN groupadd --system --gid 10001 mlsched \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /tmp \
      --shell /usr/sbin/nologin mlsched
# MPLCONFIGDIR: matplotlib (imported by the exporter's plots) wants a writable config dir.
ENV PATH=/opt/mlsched/bin:$PATH \
    HOME=/tmp \
    MPLCONFIGDIR=/tmp \
    OPENBLAS_NUM_THREADS=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /tmp
ENTRYPOINT ["mlsched", "retrain"]

# --------------------------------- reference training programs: docker build --target training
#   docker build --target training -t mlsched-training:latest .
# What manifests/samples run: examples/pytorch (all-reduce and parameter-server training of a
# small network on scikit-learn's digits, shipped inside scikit-learn) on torch's CPU wheels,
# with mlsched.training and mlsched.progress (standard library only: mlsched is installed
# without the operator's dependencies). docs/training.md.
FROM ${BASE_IMAGE} AS training
ARG TORCH_INDEX
ARG TORCH_NOT_COMPILED
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# hadolint ignore=DL3008
RUN if ! python3 -m venv --help >/dev/null 2>&1; then \
      apt-get update \
      && apt-get install -y --no-install-recommends python3 python3-venv \
      && rm -rf /var/lib/apt/lists/*; \
    fi
# torch and scikit-learn in a layer of their own, before the project's files are copied: an
# edit to the code rebuilds only the small layer after it, not gigabytes of wheels.
RUN python3 -m venv /opt/mlsched \
 && /opt/mlsched/bin/pip install --index-url "$TORCH_INDEX" "torch>=2.3" \
 && /opt/mlsched/bin/pip install "scikit-learn>=1.4" \
 && /opt/mlsched/bin/python -c "import torch, sklearn" \
 && /opt/mlsched/bin/python -m compileall -q -x "$TORCH_NOT_COMPILED" /opt/mlsched
WORKDIR /build
COPY pyproject.toml README.md ./
COPY operator ./operator
COPY examples /opt/mlsched/examples
RUN /opt/mlsched/bin/pip install --no-deps . \
 && /opt/mlsched/bin/python -c "import torch, sklearn, mlsched.training" \
 && /opt/mlsched/bin/python -m compileall -q /opt/mlsched/lib/python3*/site-packages/mlsched \
      /opt/mlsched/examples \
 && rm -rf /build \
 && groupadd --system --gid 10001 mlsched \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /tmp \
      --shell /usr/sbin/nologin mlsched
ENV PATH=/opt/mlsched/bin:$PATH \
    HOME=/tmp \
    OMP_NUM_THREADS=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /tmp
CMD ["python", "/opt/mlsched/examples/pytorch/allreduce.py"]

# -------------------------------------------------------------------------- runtime stage
# The operator image, the default target (the last stage): no torch.
FROM ${BASE_IMAGE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# openssl makes the progress endpoint's CA and certificate (--tls-secret; see
# mlsched/controller/serving/serving_tls.py for why not a Python package); a CUDA base also needs
# Python itself.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends openssl ca-certificates \
 && if ! command -v python3 >/dev/null; then \
      apt-get install -y --no-install-recommends python3; \
    fi \
 && rm -rf /var/lib/apt/lists/*

COPY --from=build /opt/mlsched /opt/mlsched

# A fixed non-root uid, matching runAsUser in manifests/base/deployment.yaml. No home: HOME
# points at /tmp, the only writable place.
RUN groupadd --system --gid 10001 mlsched \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /tmp \
      --shell /usr/sbin/nologin mlsched
ENV PATH=/opt/mlsched/bin:$PATH \
    HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /tmp

EXPOSE 8080
ENTRYPOINT ["python", "-m", "mlsched.controller"]
