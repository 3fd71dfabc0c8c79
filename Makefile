# The README's commands map to these targets. Everything runs from a local virtualenv.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
OUT    ?= out

.PHONY: demo test test-api test-real-node e2e bench bench-e2e venv dev clean

# A venv with the runtime only (no torch): enough for the simulator and the operator.
$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	touch $@

# Dev extras add pytest and torch (CPU use only; it is the `train` extra).
$(BIN)/.installed-dev: $(BIN)/.installed
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

venv: $(BIN)/.installed
dev: $(BIN)/.installed-dev

demo: $(BIN)/.installed
	$(BIN)/mlsched simulate --plot $(OUT)/jct.png

# Two workers (pytest-xdist): CI's machine has two cores, and the unit tests share no state.
# Two tiers, each with its own summary: the fast tier (no torch; conftest.py does not even
# collect the training modules), then the modules that train or run torch networks (marked
# `training`) and the tests that check a shipped figure with whole simulations (`figures`;
# pyproject.toml). The slowest tests of each are listed, to see where time goes.
test: $(BIN)/.installed-dev
	$(BIN)/python -m pytest -q -n 2 -m "not training and not figures" --durations=10 tests
	$(BIN)/python -m pytest -q -n 2 -m "training or figures" --durations=10 tests

# e2e/build_all.sh builds what the tests run on, into ~/.cache/mlsched-e2e on first use: etcd,
# kube-apiserver, KCM, kube-scheduler, kubectl, kwok, kubelet, kube-proxy and CoreDNS from the
# Go module proxy (18.5 minutes cold), Argo CD's health assessment for the checks of
# manifests/argocd (e2e/argocd_health, 4 minutes) and Prometheus' promtool for the alerts of
# manifests/monitoring (3 minutes), one after another; meanwhile, in the background, the images
# the real node runs, built from this checkout with buildah (13 minutes beside the compiler).
# 15-25 minutes in all from empty caches (docs/e2e.md, "A cold .ci/run"). The
# real node runs on Debian's containerd, runc, CNI plugins and iptables, installed when missing
# (root).
# A hung test fails after 15 minutes with its stack instead of eating CI's 90; the 20 slowest
# tests are listed at the end (what to look at when the suite's time grows).
# Three tiers, each its own pytest run, a failure stopping the rest: the apiserver-only tier
# (e2e/apiserver/: etcd and kube-apiserver with the CRDs, as envtest runs them; `make
# test-api`); the full control plane with kwok's nodes, on three xdist workers with a plane
# each, a module to a worker (the longest first: e2e/conftest.py; about 11.5 minutes on 2
# cores, docs/e2e.md "Three planes at once"); then the real node alone (`make
# test-real-node`), whose training pods want the cores to themselves.
e2e: $(BIN)/.installed-dev
	bash e2e/build_all.sh
	$(API_TIER)
	$(FULL_PLANE)
	$(REAL_NODE_TIER)

E2E_PYTEST = $(BIN)/python -m pytest -q -o timeout_func_only=true --timeout=900 --durations=20
FULL_PLANE = $(E2E_PYTEST) -n 3 --dist loadfile --no-loadscope-reorder e2e \
	--ignore=e2e/apiserver --ignore=e2e/test_real_node.py
REAL_NODE_TIER = $(E2E_PYTEST) e2e/test_real_node.py

# The real node alone (root; docs/e2e.md "The real node"): builds what it needs on first use.
test-real-node: $(BIN)/.installed-dev
	bash e2e/build_all.sh
	$(REAL_NODE_TIER)

# The apiserver-only tier alone: needs only the control plane's binaries (a few ms once built;
# about 13 minutes cold), starts in seconds (printed), no scheduler, KCM or nodes.
API_TIER = $(BIN)/python -m pytest -q e2e/apiserver -o timeout_func_only=true --timeout=300 --durations=10
test-api: $(BIN)/.installed-dev
	bash e2e/build_control_plane.sh
	$(API_TIER)

# Operator latency and scale against the real control plane (several minutes).
bench-e2e: $(BIN)/.installed-dev
	bash e2e/build_control_plane.sh
	$(BIN)/python bench/bench_e2e.py

bench: $(BIN)/.installed-dev
	$(BIN)/python bench/bench_simulator.py
	$(BIN)/python bench/bench_operator.py
	$(BIN)/python bench/bench_gc.py
	$(BIN)/python bench/bench_dl2.py
	$(BIN)/python bench/bench_placement.py

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache
