# trainingrun — the two commands a new machine needs are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# Test-bed binaries (kube-apiserver, etcd, kwok, KubeRay, helm, prometheus) are built once into this cache.
TESTBED_CACHE ?= $(HOME)/.cache/trainingrun

.PHONY: install demo test test-without-bed test-unit testbed images bench lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[operator,runtime,dev]'
	touch $@

demo: install
	$(VENV)/bin/trainingrun run manifests/examples/tiny.yaml --root runs

testbed:
	TESTBED_CACHE=$(TESTBED_CACHE) $(BUILD_NICE) bash hack/testbed/build.sh

# localhost/trainingrun-operator:dev and localhost/trainingrun-runtime:dev with podman (installs podman, runc and
# mmdebstrap from Debian's packages if missing); rebuilt only when their inputs change.
images:
	TESTBED_CACHE=$(TESTBED_CACHE) $(BUILD_NICE) bash hack/images/build.sh

# On a new machine the test bed and the images take about half an hour to build, and most tests do not need them.
# So the tests run in two groups. First, side by side: lint (which installs the venv), the test-bed build, the images
# and, as soon as the venv is there, every test that needs neither the bed nor the images (unit, and integration on
# real Ray, TransferQueue and torch). The builds run at a lower priority (nice) so that they take the CPU those tests
# leave idle rather than slow them down. (No --output-sync: it would hold each build's log until it ends; every line
# of theirs says whose it is.) Then the tests that need the bed or the images: cluster (real API server), containers
# (the images, run by podman) and e2e. The second group runs even when the first failed, so one run shows every
# failure; `make test` fails if either did. The two marker expressions are each other's complement: every test runs
# once. On a warm machine the builds are done in seconds and the groups simply run one after the other.
BED_TESTS := cluster or containers

test:
	@$(MAKE) --no-print-directory -j4 lint testbed images test-without-bed BUILD_NICE="nice -n 10"; first=$$?; \
	TESTBED_CACHE=$(TESTBED_CACHE) $(PY) -m pytest -m "$(BED_TESTS)"; second=$$?; \
	exit $$(( first != 0 || second != 0 ))

test-without-bed: install
	$(PY) -m pytest -m "not ($(BED_TESTS))"

test-unit: install
	$(PY) -m pytest tests/unit

# mypy --strict on both packages, the import contracts (pyproject.toml), ruff's formatting and its lint rules.
lint: install
	$(PY) -m mypy operator/trainingrun_operator runtime/trainingrun_runtime
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

bench: install testbed
	TESTBED_CACHE=$(TESTBED_CACHE) $(PY) bench/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache bench-results.json
