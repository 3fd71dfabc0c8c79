#!/usr/bin/env bash
# Builds Prometheus' own `promtool` from the Go module proxy and fetches the Prometheus
# Operator's CRDs of PodMonitor and PrometheusRule, so that manifests/monitoring is tested with
# Prometheus' rule engine and against the real schemas (e2e/test_monitoring.py) rather than a
# re-implementation.
#
# Nothing lands in the repo: the binary, the CRDs and Go's caches live in
#   ${MLSCHED_E2E_CACHE:-$HOME/.cache/mlsched-e2e}/prometheus-tools-<versions>-r<recipe>/
# next to the control plane's binaries (build_control_plane.sh). The directory is printed as
# the last line of stdout; progress and errors go to stderr. When it is already complete the
# script prints it and exits at once.
set -Eeuo pipefail

# Module versions: github.com/prometheus/prometheus v0.316.0 is Prometheus 3.16's promtool;
# the Prometheus Operator's CRDs are those of its v0.85.0 release.
# The build tag remove_all_sd is Prometheus' own switch (plugins/plugin_*.go) that leaves out the
# service-discovery plugins (AWS, Azure, GCE and twenty more cloud SDKs): the tests run only
# `check rules`, `test rules` and `check metrics`, none of which reads a scrape config. It cuts
# the cold build's CPU time by about half (measured in the script's log line below).
PROMETHEUS_VERSION="${MLSCHED_PROMETHEUS_VERSION:-v0.316.0}"
OPERATOR_VERSION="${MLSCHED_PROMETHEUS_OPERATOR_VERSION:-v0.85.0}"
PROMETHEUS_MODULE="github.com/prometheus/prometheus"
OPERATOR_MODULE="github.com/prometheus-operator/prometheus-operator"
# Bump when the way promtool is built changes, so a stale binary is not reused.
RECIPE=2

CACHE_ROOT="${MLSCHED_E2E_CACHE:-$HOME/.cache/mlsched-e2e}"
BUILD_ROOT="$CACHE_ROOT/prometheus-tools-$PROMETHEUS_VERSION-$OPERATOR_VERSION-r$RECIPE"
OUT="$BUILD_ROOT/bin"
CRDS=(monitoring.coreos.com_podmonitors.yaml monitoring.coreos.com_prometheusrules.yaml)

built() {
  local crd
  [[ -x "$OUT/promtool" ]] || return 1
  for crd in "${CRDS[@]}"; do [[ -f "$OUT/$crd" ]] || return 1; done
}

if built; then
  echo "$OUT"
  exit 0
fi

LOG_TAG=build_prometheus_tools
# shellcheck source=build_common.sh
. "$(dirname "${BASH_SOURCE[0]}")/build_common.sh"
find_go

lock_cache build-prometheus-tools.lock
if built; then
  echo "$OUT"
  exit 0
fi

go_env

LOG="$BUILD_ROOT/build.log"
mkdir -p "$BUILD_ROOT"
: >"$LOG"
on_error() {
  local rc=$?
  [[ "$BASHPID" == "$$" ]] || exit "$rc"
  log "ERROR: building the Prometheus tools failed (exit $rc). Last lines of $LOG:"
  tail -n 30 "$LOG" >&2 || true
  log "What to do: check that the Go module proxy is reachable ('$GO env GOPROXY') and that"
  log "$PROMETHEUS_MODULE@$PROMETHEUS_VERSION and $OPERATOR_MODULE@$OPERATOR_VERSION exist there"
  log "('$GO list -m -versions <module>'); then rerun $0."
  exit "$rc"
}
trap on_error ERR

run() {
  echo "+ $*" >>"$LOG"
  "$@" >>"$LOG" 2>&1
}

START=$SECONDS
PARTIAL="$BUILD_ROOT/bin.partial"
rm -rf "$PARTIAL"
mkdir -p "$PARTIAL"
log "compiling promtool ($PROMETHEUS_MODULE@$PROMETHEUS_VERSION, without the cloud service"
log "discovery plugins; about 3 min on 2 cores, log: $LOG)"
GOBIN="$PARTIAL" run "$GO" install -p 2 -trimpath -tags remove_all_sd -ldflags "-s -w" \
  "$PROMETHEUS_MODULE/cmd/promtool@$PROMETHEUS_VERSION"
"$PARTIAL/promtool" --version >/dev/null \
  || die "the built promtool does not run"

log "fetching the CRDs of $OPERATOR_MODULE@$OPERATOR_VERSION (the module's source, not built)"
run "$GO" mod download "$OPERATOR_MODULE@$OPERATOR_VERSION"
dir="$(module_field "$OPERATOR_MODULE@$OPERATOR_VERSION" Dir)"
[[ -d "$dir" ]] || die "no source directory for $OPERATOR_MODULE@$OPERATOR_VERSION"
for crd in "${CRDS[@]}"; do cp "$dir/example/prometheus-operator-crd/$crd" "$PARTIAL/"; done

rm -rf "$OUT"
mv "$PARTIAL" "$OUT"
log "built promtool and fetched the CRDs in $((SECONDS - START)) s"
echo "$OUT"
