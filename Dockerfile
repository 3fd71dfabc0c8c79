# The mlsched operator image: the runtime package only (no torch; learned policies are served
# with onnxruntime). Build from the repository root:
#   docker build -t mlsched-operator:latest .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /build
COPY pyproject.toml README.md ./
COPY operator ./operator
# For the ONNX artifacts it ships (policy_models/artifacts): the default model of a learned
# policy whose SchedulingPolicy names no file. Its torch code is never imported at runtime.
COPY policy_models ./policy_models
RUN pip install . && rm -rf /build
# openssl makes the progress endpoint's CA and certificate (--tls-secret; see
# mlsched/controller/serving_tls.py for why not a Python package). Debian's ca-certificates
# already pulls it in; named here so that the image does not depend on that.
RUN apt-get update && apt-get install -y --no-install-recommends openssl \
 && rm -rf /var/lib/apt/lists/*

# A fixed non-root uid, matching runAsUser in manifests/base/deployment.yaml.
RUN groupadd --system --gid 10001 mlsched \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin mlsched
USER 10001:10001
WORKDIR /tmp

EXPOSE 8080
ENTRYPOINT ["python", "-m", "mlsched.controller"]
