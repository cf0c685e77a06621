# gpuplace: every target bootstraps what it needs; `make test` and `make demo` work on a fresh clone.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export GPUPLACE_CACHE ?= $(HOME)/.cache/gpuplace

.PHONY: docs docs-ref crds test-tools help venv image e2e-chart control-plane node tools argocd argo-workflows training-operators redis demo-quick fakenvml lint test unit integration e2e e2e-argocd e2e-preflight demo bench bench-scale bench-memory cluster-up cluster-down clean

help:
	@echo "make test | demo | demo-quick | lint | docs | docs-ref | image | e2e-chart | bench | bench-scale | bench-memory | e2e-argocd | e2e-preflight | cluster-up | cluster-down | control-plane | node | argocd | argo-workflows | clean"

# The product (editable) and, from dev/, its development environment (gpuplace cluster|demo).
$(STAMP): pyproject.toml dev/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,workflows]' -e ./dev
	touch $@

venv: $(STAMP)

control-plane:
	@hack/build-control-plane.sh >/dev/null

# The gpuplace image from the Dockerfile, built with buildah on a Debian base made by mmdebstrap
# (both installed with apt-get when missing), as a reproducible OCI archive under
# $(GPUPLACE_CACHE)/image: prints its name, digest, size and path (about a minute the first time).
image:
	@hack/build-image.sh

# The real node: kubelet, containerd, runc, CNI plugins (from Go modules) and the pause and
# gpu-probe image payloads, into $(GPUPLACE_CACHE)/node (about 3 minutes the first time).
node:
	@hack/build-node.sh >/dev/null

# helm (built from its Go module) and the third-party CRDs the chart and argocd/ are checked against.
tools:
	@hack/build-tools.sh >/dev/null

# ArgoCD's application-controller, repo-server and applicationset-controller, and kustomize, built
# from their Go modules (several minutes the first time); `make demo` syncs through them once built.
argocd:
	@hack/build-argocd.sh >/dev/null

# Argo Workflows' workflow controller and argoexec, built from their Go module (many minutes the
# first time); the preflight tier (`make e2e-preflight`) gates ArgoCD syncs through them.
argo-workflows:
	@hack/build-argo-workflows.sh >/dev/null

# JobSet's and LeaderWorkerSet's controller managers, built from their Go modules (a few minutes
# the first time), for the training-operator integration tests.
training-operators:
	@hack/build-training-operators.sh >/dev/null

# Debian's redis-server for ArgoCD's cache, installed with apt-get (as root) when missing.
redis:
	@hack/ensure-redis.sh

fakenvml:
	@$(MAKE) --no-print-directory -C tests/fakenvml

# charts/gpuplace/crds: the PlacementMap and PlacementPolicy CRDs, generated from the models in
# placement/ (a unit test checks the files match).
crds: $(STAMP)
	$(BIN)/gpuplace crds --write charts/gpuplace/crds

# docs/reference: the CLI, chart values and CRD fields, generated from the parser,
# charts/gpuplace/values.schema.json and the CRD models (a unit test checks the files match).
docs-ref: $(STAMP)
	$(BIN)/python -m gpuplace_dev.docsref --write docs/reference

# The documentation site into site/, strict: a broken link or anchor fails the build. First every
# file, module, Class.member, make target and CLI flag the pages name in backticks must exist in
# the tree (python -m gpuplace_dev.docscheck), and no file may cite a page outside the repository.
docs: $(STAMP)
	$(BIN)/python -m gpuplace_dev.docscheck
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# Debian packages the tests run: zsh (the completion scripts), prometheus and promtool (the
# metrics' names and help, the alert rules' unit tests, the dashboard's queries), chromium (the
# web view in a real browser).
test-tools:
	@hack/ensure-apt.sh zsh promtool:prometheus chromium

# The tests run in TEST_WORKERS processes (pytest-xdist): each test file on one worker, the real
# node's tests on one worker together (tests/conftest.py), each worker that runs integration tests
# with a local cluster of its own. They mostly wait on the apiserver and on processes, which is
# why 3 workers beat 2 on 2 cores. TEST_WORKERS=0 runs them in one process.
TEST_WORKERS ?= 3
PYTEST_PARALLEL = -n $(TEST_WORKERS) --dist loadfile

unit: $(STAMP) tools fakenvml test-tools
	$(BIN)/pytest tests/unit -q $(PYTEST_PARALLEL)

integration: $(STAMP) control-plane node tools fakenvml training-operators
	$(BIN)/pytest tests/integration -q $(PYTEST_PARALLEL)

# tools: the demo renders the chart's ClusterRole gpuplace-plan with helm for `gpuplace plan`.
e2e: $(STAMP) control-plane node tools fakenvml
	$(BIN)/pytest tests/e2e -q

test: $(STAMP) control-plane node tools fakenvml test-tools training-operators
	$(BIN)/pytest tests -q -m "not argocd and not chart" $(PYTEST_PARALLEL) --durations=25

# gpuplace installed as a platform team installs it: the image built here (make image), the chart
# installed with helm on the local cluster's real node, then what a user does with it.
e2e-chart: $(STAMP) control-plane node tools fakenvml image
	@hack/ensure-apt.sh iptables
	$(BIN)/pytest tests/e2e_chart -q -m chart -rP

# The flow through real ArgoCD. -rP prints the scenario, with the Application's sync and health
# status at each step; then ArgoCD deploys gpuplace itself (the chart's Application, the image built
# here) on the real node, and an Application deleted and created again keeps the running pods.
e2e-argocd: $(STAMP) control-plane node tools fakenvml argocd redis image
	@hack/ensure-apt.sh iptables
	$(BIN)/pytest tests/e2e_argocd -q -m "argocd and not preflight" -rP

# The preflight gate through real ArgoCD and a real Argo Workflows controller: a map directory
# whose kustomization includes the `gpuplace preflight` Workflow (a PreSync hook); a good commit
# is applied after its Workflow passed on the real node, a commit naming a missing GPU is not.
e2e-preflight: $(STAMP) control-plane node tools fakenvml argocd argo-workflows redis image
	@hack/ensure-apt.sh iptables
	$(BIN)/pytest tests/e2e_argocd -q -m preflight -rP

# The whole flow through real ArgoCD: ArgoCD deploys gpuplace (its chart, the image built here) onto
# the real node, then the maps; gpu-probe pods on the real node next to the kwok nodes.
demo: $(STAMP) control-plane node tools fakenvml argocd redis image
	@hack/ensure-apt.sh iptables
	$(BIN)/gpuplace demo

# The same scenario synced with kustomize + kubectl apply, all pods on kwok nodes.
demo-quick: $(STAMP) control-plane tools fakenvml
	$(BIN)/gpuplace demo --no-argocd --kwok-only

# Includes the GitOps latency through real ArgoCD (bench/gitops.py), hence argocd and redis.
bench: $(STAMP) control-plane tools fakenvml argocd redis
	$(BIN)/python -m bench

# The placement benchmark at the design's scale (5,000 nodes, 10,000 pods, every agent's
# heartbeat, a leader failover); about an hour on two cores, so not part of `make bench`.
bench-scale: $(STAMP) control-plane tools fakenvml
	$(BIN)/python -m bench.scale $(BENCH_SCALE_ARGS)

# The controller's memory and start-up with 5,000 nodes x 8 GPUs held by 40,000 bound pods (no
# heartbeats; bench/memory.py says what else it leaves out); about half an hour on two cores.
bench-memory: $(STAMP) control-plane tools
	$(BIN)/python -m bench.memory $(BENCH_MEMORY_ARGS)

cluster-up: $(STAMP) control-plane tools fakenvml
	$(BIN)/gpuplace cluster up

cluster-down: $(STAMP)
	$(BIN)/gpuplace cluster down

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache tests/fakenvml/build
