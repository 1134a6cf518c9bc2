# The two set-up commands of the README: `make run` and `make test`.
# Prerequisites: Python 3.11+, make, a JDK 17+ and Maven (for the test Kafka broker).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev

.PHONY: run test venv lint format typecheck bench clean kcat chromium promtool kubeconform

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

## make run: the main job on the embedded default (no broker): the quickstart scenario, every policy.
run: $(STAMP)
	$(BIN)/headroom simulate scenarios/quickstart.yaml

## make test: lint, then the whole suite, including the integration tests on a real Kafka broker
## (started here unless KAFKA_BOOTSTRAP_SERVERS names one, and stopped afterwards, whatever the
## outcome). Extra pytest arguments: make test PYTEST_ARGS="-k recording -x".
## The whole suite runs in the lanes of tests/conftest.py, pytest processes side by side (the
## integration tests in two, the unit + simulation tests under nice until those have ended, the
## engines' comparison alone at the end; tools/run-tests.sh --whole-suite), measures the branch
## coverage of the package headroom and fails under the floor of pyproject.toml ([tool.coverage]);
## a subset runs in one process and is measured only if asked, e.g.
## make test PYTEST_ARGS="tests/unit" COVERAGE="--cov --cov-fail-under=0".
PYTEST_ARGS ?=
COVERAGE ?=
test: $(STAMP) kcat chromium promtool kubeconform
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	PATH="$(abspath $(BIN)):$$PATH" ./tools/run-tests.sh $(if $(PYTEST_ARGS),$(COVERAGE) $(PYTEST_ARGS),--whole-suite)

## make kcat: install kcat (Debian package; needs root or sudo) unless it is already there.
kcat:
	@./tools/install-debian-package.sh kcat kcat

## make chromium: install Chromium (Debian package `chromium`; needs root or sudo) unless it is
## already there; the report browser test renders report.html in it, headless.
chromium:
	@./tools/install-debian-package.sh chromium chromium chromium-browser

## make promtool: install Debian's package `prometheus` (needs root or sudo) unless its promtool
## and prometheus are already there: the tests check the alert rules and scrape configs with
## promtool, and run the dashboard's queries and the rules in a Prometheus against a live stack.
promtool:
	@./tools/install-debian-package.sh prometheus promtool
	@./tools/install-debian-package.sh prometheus prometheus

## make kubeconform: the Kubernetes manifest validator (a Go module, built with `go install` into
## the virtual environment; Debian's golang-go if no Go is on PATH) and the Kubernetes JSON schemas
## it checks deploy/k8s against (the kubernetes-validate package, into the virtual environment).
KUBECONFORM_VERSION ?= v0.8.0
KUBERNETES_VALIDATE_VERSION ?= 1.37.0
kubeconform: $(STAMP)
	@test -x $(BIN)/kubeconform || { \
	  command -v go >/dev/null 2>&1 || ./tools/install-debian-package.sh golang-go go; \
	  GOBIN="$(abspath $(BIN))" go install \
	    github.com/yannh/kubeconform/cmd/kubeconform@$(KUBECONFORM_VERSION); }
	@$(BIN)/python -c 'import kubernetes_validate' 2>/dev/null || \
	  $(BIN)/python -m pip install -q 'kubernetes-validate==$(KUBERNETES_VALIDATE_VERSION)'

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/headroom bench --out BENCH.json

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache headroom/broker/libs
