#!/usr/bin/env bash
# Builds the images the real node runs (e2e/real_node.py) from this checkout, with nothing but
# Debian's packages and PyPI: the public base image (python:*-slim) lives on a registry these
# machines cannot reach.
#
#   base      mmdebstrap of Debian bookworm with python3 (3.11) and python3-venv, made into an
#             image by buildah: what BASE_IMAGE is in the Dockerfile
#   pause     the pod sandbox image containerd starts first in every pod (registry.k8s.io/pause
#             cannot be pulled): the base image running `sleep infinity`
#   operator  the Dockerfile's default target, FROM the base
#   training  the Dockerfile's `training` target (examples/pytorch), FROM the base, with torch
#             from PyPI (download.pytorch.org is not reachable here)
#
# Each lands as an OCI archive in ${MLSCHED_E2E_CACHE:-~/.cache/mlsched-e2e}/images-r<n>/<key>/,
# printed as the last line of stdout; <key> is a hash of the build context, so an edit to the
# code or the Dockerfile builds again (buildah's layer cache keeps torch's layer). With every
# archive there the script prints that directory at once. Progress goes to stderr.
#
# Needs root and the Debian packages buildah and mmdebstrap.
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Bump when the way images are built changes (not the Dockerfile: that is in the key).
RECIPE=1
SUITE=bookworm
CACHE_ROOT="${MLSCHED_E2E_CACHE:-$HOME/.cache/mlsched-e2e}"
IMAGES_ROOT="$CACHE_ROOT/images-r$RECIPE"
IMAGES=(pause operator training)
TAG=e2e

LOG_TAG=build_images
log() { echo "[$LOG_TAG] $*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}

# The build context's files, as .dockerignore lets them in, and this script: their hash names
# the images' directory.
context_key() {
  cd "$ROOT"
  {
    find Dockerfile .dockerignore pyproject.toml README.md operator policy_models examples \
      -type f -not -path '*/__pycache__/*' -not -name '*.pyc' -not -path '*.egg-info/*' -print0 |
      sort -z | xargs -0 sha256sum
    # The script's content only: sha256sum FILE would print the path as invoked too, and `make
    # e2e` (e2e/build_images.sh) and the tests' fixture (an absolute path) would get two keys,
    # building the images twice in one CI run.
    sha256sum <"${BASH_SOURCE[0]}"
  } | sha256sum | cut -c1-16
}

KEY="$(context_key)"
# --print-key: the key alone, to check that every way of calling this script agrees on it.
if [[ "${1:-}" == --print-key ]]; then
  echo "$KEY"
  exit 0
fi
OUT="$IMAGES_ROOT/$KEY"
all_built() {
  local image
  for image in "${IMAGES[@]}"; do [[ -f "$OUT/$image.tar" ]] || return 1; done
}
if all_built; then
  echo "$OUT"
  exit 0
fi

[[ "$(id -u)" == 0 ]] || die "building images with buildah and mmdebstrap needs root here"
for tool in buildah mmdebstrap; do
  command -v "$tool" >/dev/null || die "$tool not found: apt-get install -y buildah mmdebstrap"
done

mkdir -p "$IMAGES_ROOT"
exec 9>"$IMAGES_ROOT/build.lock"
flock 9
if all_built; then
  echo "$OUT"
  exit 0
fi
START=$SECONDS
LOG_DIR="$IMAGES_ROOT/logs"
mkdir -p "$LOG_DIR"

# This machine reaches PyPI and Debian's mirrors through its own certificate authority, which a
# fresh Debian root does not trust: its CA bundle and pip's settings are mounted into each RUN
# (never baked into an image).
MOUNTS=()
[[ -f /etc/ssl/certs/ca-certificates.crt ]] &&
  MOUNTS+=(-v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
[[ -f /etc/pip.conf ]] && MOUNTS+=(-v /etc/pip.conf:/etc/pip.conf:ro)

# step NAME CMD...: runs CMD with its output in NAME's log, and names that log when it fails.
step() {
  local name="$1" started=$SECONDS
  shift
  log "$name (log: $LOG_DIR/$name.log)"
  if ! "$@" >"$LOG_DIR/$name.log" 2>&1; then
    tail -n 30 "$LOG_DIR/$name.log" >&2
    die "$name failed; the whole log: $LOG_DIR/$name.log"
  fi
  log "$name: $((SECONDS - started)) s"
}

BASE="localhost/mlsched-base:$SUITE-r$RECIPE"
make_base() {
  local rootfs="$IMAGES_ROOT/base-$SUITE.tar" container
  if [[ ! -f "$rootfs" ]]; then
    # mmdebstrap picks its output format from the name's extension: keep .tar.
    mmdebstrap --variant=apt --include=python3,python3-venv,ca-certificates \
      "$SUITE" "${rootfs%.tar}.partial.tar"
    mv "${rootfs%.tar}.partial.tar" "$rootfs"
  fi
  container="$(buildah from scratch)"
  buildah add "$container" "$rootfs" /
  buildah config --cmd /bin/bash \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$container"
  buildah commit "$container" "$BASE"
  buildah rm "$container"
}

make_pause() {
  local container
  container="$(buildah from --pull=never "$BASE")"
  buildah config --entrypoint '["/bin/sleep", "infinity"]' --cmd '' "$container"
  buildah commit "$container" "localhost/mlsched-pause:$TAG"
  buildah rm "$container"
}

# build_target NAME [--target T]: the Dockerfile FROM the local base.
build_target() {
  local name="$1"
  shift
  # Docker's image format: OCI's has no SHELL, and the Dockerfile's RUNs use bash's pipefail.
  buildah bud --isolation chroot --pull=never --layers --format docker "${MOUNTS[@]}" \
    --build-arg "BASE_IMAGE=$BASE" --build-arg TORCH_INDEX=https://pypi.org/simple \
    -t "localhost/mlsched-$name:$TAG" "$@" "$ROOT"
}

# Layers uncompressed: containerd unpacks them at once, and gzip of torch's gigabytes would
# cost minutes of the two cores.
export_image() {
  buildah push --disable-compression "localhost/mlsched-$1:$TAG" \
    "oci-archive:$STAGE/$1.tar:localhost/mlsched-$1:$TAG"
}

STAGE="$OUT.partial"
rm -rf "$STAGE" && mkdir -p "$STAGE"
if ! buildah inspect --type image "$BASE" >/dev/null 2>&1; then step base make_base; fi
step pause make_pause
step operator build_target operator
step training build_target training --target training
for image in "${IMAGES[@]}"; do step "export-$image" export_image "$image"; done

# Publish at once; older contexts' archives go (each set is gigabytes).
find "$IMAGES_ROOT" -mindepth 1 -maxdepth 1 -type d -not -name logs -not -name "$KEY.partial" \
  -exec rm -rf {} +
mv "$STAGE" "$OUT"
log "built ${IMAGES[*]} in $((SECONDS - START)) s"
echo "$OUT"
