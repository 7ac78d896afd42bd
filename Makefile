# trainingrun — the two commands a new machine needs are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# Test-bed binaries (kube-apiserver, etcd, kwok, KubeRay, helm, prometheus) are built once into this cache.
TESTBED_CACHE ?= $(HOME)/.cache/trainingrun

.PHONY: install demo test test-unit testbed images bench lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[operator,runtime,dev]'
	touch $@

demo: install
	$(VENV)/bin/trainingrun run manifests/examples/tiny.yaml --root runs

testbed:
	TESTBED_CACHE=$(TESTBED_CACHE) bash hack/testbed/build.sh

# localhost/trainingrun-operator:dev and localhost/trainingrun-runtime:dev with podman (installs podman, runc and
# mmdebstrap from Debian's packages if missing); rebuilt only when their inputs change.
images:
	TESTBED_CACHE=$(TESTBED_CACHE) bash hack/images/build.sh

# First the set-ups, side by side: lint (which installs the venv), the test-bed build and the images. The Go
# builds keep both CPUs busy while the venv and the runtime image mostly wait on downloads, so on a cold machine
# this saves the venv's and the images' minutes. (No --output-sync: it would hold each build's log until it ends;
# every line of theirs says whose it is.) Then every test: unit, integration (real Ray, TransferQueue, torch),
# cluster (real API server), containers (the images, run by podman) and e2e.
test:
	$(MAKE) --no-print-directory -j3 lint testbed images
	TESTBED_CACHE=$(TESTBED_CACHE) $(PY) -m pytest

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
