# Sourced by the e2e build scripts once CACHE_ROOT is set: every Go cache inside the cache dir
# (deleting it resets everything), the module cache writable so that `rm -rf` works on it, the
# local toolchain unless told otherwise, and static binaries, as upstream ships them. The
# control plane and the argocd CLI share the caches: Kubernetes' packages compile once.
export GOMODCACHE="$CACHE_ROOT/go/mod"
export GOCACHE="$CACHE_ROOT/go/build"
export GOFLAGS="-modcacherw -buildvcs=false"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
export GOWORK=off GO111MODULE=on
export CGO_ENABLED=0
