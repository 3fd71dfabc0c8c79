#!/usr/bin/env bash
# Builds e2e/argocd_health/main.go inside Argo CD's own module source, fetched from the Go
# module proxy, so that the health checks in manifests/argocd/ are tested with Argo CD's
# settings and Lua code rather than a re-implementation (e2e/test_argocd_health.py). The
# program does what `argocd admin settings resource-overrides health` does, with the same
# packages, without linking the whole CLI: about 1,500 Go packages instead of 2,200 (the CLI
# took 15 minutes cold on two cores). Its outputs were compared with the CLI's on every
# testdata object of manifests/argocd when it replaced it: identical.
#
# Nothing lands in the repo: the source copy, Go's caches and the binary live in
#   ${MLSCHED_E2E_CACHE:-$HOME/.cache/mlsched-e2e}/argocd-<version>-r<recipe>/
# next to the control plane's binaries (build_control_plane.sh). The binary's path is printed
# as the last line of stdout; progress and errors go to stderr. When the binary is already
# there the script prints its path and exits at once.
#
# Override the version with MLSCHED_ARGOCD_VERSION (each version gets its own dir).
set -Eeuo pipefail

# v3.2 is the newest line whose go.mod takes gitops-engine from the module proxy: from v3.3
# on it is replaced by ./gitops-engine, a nested module that module zips leave out and the
# proxy does not serve, so those versions cannot be built from the proxy alone. (v3.2.12
# does not compile: controller/cache calls a settings function the tag lacks.)
ARGOCD_VERSION="${MLSCHED_ARGOCD_VERSION:-v3.2.11}"
MODULE="github.com/argoproj/argo-cd/v3"
# Bump when the way the binary is built changes, so stale caches are not reused.
# r2: the health program instead of the whole CLI.
RECIPE=2

# MLSCHED_ARGOCD_CACHE moves only this build (e.g. to time a cold one).
CACHE_ROOT="${MLSCHED_ARGOCD_CACHE:-${MLSCHED_E2E_CACHE:-$HOME/.cache/mlsched-e2e}}"
BUILD_ROOT="$CACHE_ROOT/argocd-$ARGOCD_VERSION-r$RECIPE"
BIN="$BUILD_ROOT/bin/mlsched-argocd-health"
PROGRAM="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/argocd_health/main.go"
# Argo CD's own CRDs of Application and AppProject, beside the binary: the e2e tests validate
# manifests/argocd/ against them.
CRDS=(application-crd.yaml appproject-crd.yaml)

built() {
  local crd
  [[ -x "$BIN" ]] || return 1
  for crd in "${CRDS[@]}"; do [[ -f "$BUILD_ROOT/bin/$crd" ]] || return 1; done
}

# Fast path: a warm cache costs a few stats.
if built; then
  echo "$BIN"
  exit 0
fi

LOG_TAG=build_argocd
# shellcheck source=build_common.sh
. "$(dirname "${BASH_SOURCE[0]}")/build_common.sh"
find_go

lock_cache build-argocd.lock
if built; then # someone else finished the build while we waited
  echo "$BIN"
  exit 0
fi

go_env

LOG="$BUILD_ROOT/build.log"
SRC="$BUILD_ROOT/src"
mkdir -p "$BUILD_ROOT"
: >"$LOG"
on_error() {
  local rc=$?
  [[ "$BASHPID" == "$$" ]] || exit "$rc"
  log "ERROR: building argocd $ARGOCD_VERSION failed (exit $rc). Last lines of $LOG:"
  tail -n 30 "$LOG" >&2 || true
  log "What to do: check that the Go module proxy is reachable ('$GO env GOPROXY'), that"
  log "$MODULE@$ARGOCD_VERSION exists there ('$GO list -m -versions $MODULE') and that its"
  log "go.mod's 'go' line is not newer than $("$GO" env GOVERSION); then rerun $0."
  exit "$rc"
}
trap on_error ERR

run() {
  echo "+ $*" >>"$LOG"
  "$@" >>"$LOG" 2>&1
}

START=$SECONDS
log "downloading $MODULE@$ARGOCD_VERSION from the module proxy (log: $LOG)"
run "$GO" mod download "$MODULE@$ARGOCD_VERSION"
# The module's go.mod has replace directives, which 'go install module@version' refuses; they
# only apply to a main module. So build inside (a writable copy of) the module's own source.
dir="$(module_field "$MODULE@$ARGOCD_VERSION" Dir)"
[[ -d "$dir" ]] || die "no source directory for $MODULE@$ARGOCD_VERSION"
rm -rf "$SRC"
cp -r "$dir" "$SRC"
chmod -R u+w "$SRC"
cd "$SRC"

# The proxy's .info carries the tag's time: a reproducible build date.
info="$(module_field "$MODULE@$ARGOCD_VERSION" Info)"
build_date="$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "$info")"
pkg="$MODULE/common"
ldflags="-s -w -X $pkg.version=${ARGOCD_VERSION#v} -X $pkg.buildDate=${build_date:-1970-01-01T00:00:00Z}"
ldflags+=" -X $pkg.gitTag=$ARGOCD_VERSION -X $pkg.gitTreeState=clean"

# Inside the module's tree, so that its go.mod (replace directives included) applies.
mkdir -p hack/mlsched-argocd-health
cp "$PROGRAM" hack/mlsched-argocd-health/main.go
log "compiling the health program against Argo CD's packages (about 5 min cold on 2 cores)"
mkdir -p "$BUILD_ROOT/bin.partial"
# Two compile jobs at a time keep memory and load sane on two cores.
run "$GO" build -p 2 -trimpath -ldflags "$ldflags" \
  -o "$BUILD_ROOT/bin.partial/mlsched-argocd-health" ./hack/mlsched-argocd-health

for crd in "${CRDS[@]}"; do cp "$SRC/manifests/crds/$crd" "$BUILD_ROOT/bin.partial/"; done
reported="$("$BUILD_ROOT/bin.partial/mlsched-argocd-health" version)"
echo "$reported" >>"$LOG"
[[ "$reported" == *"${ARGOCD_VERSION#v}"* ]] || die "the built program reports '$reported'"
# The source copy (70 MB) is only needed to build; Go's caches keep what a rebuild reuses.
rm -rf "$SRC"
# Publish at once, so a half-finished build never looks complete.
rm -rf "$BUILD_ROOT/bin"
mv "$BUILD_ROOT/bin.partial" "$BUILD_ROOT/bin"
log "built the health program of argocd $ARGOCD_VERSION in $((SECONDS - START)) s"
echo "$BIN"
