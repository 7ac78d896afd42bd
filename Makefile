# trainingrun — the two commands a new machine needs are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# Test-bed binaries (kube-apiserver, etcd, kwok, KubeRay, helm, prometheus) are built once into this cache.
TESTBED_CACHE ?= $(HOME)/.cache/trainingrun

.PHONY: install demo test test-without-bed test-with-bed test-unit testbed images bench lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[operator,runtime,trl,dev]'
	touch $@

demo: install
	$(VENV)/bin/trainingrun run manifests/examples/tiny.yaml --root runs

testbed:
	TESTBED_CACHE=$(TESTBED_CACHE) bash hack/testbed/build.sh

# localhost/trainingrun-operator:dev and localhost/trainingrun-runtime:dev with podman (installs podman, runc and
# mmdebstrap from Debian's packages if missing); rebuilt only when their inputs change.
images:
	TESTBED_CACHE=$(TESTBED_CACHE) bash hack/images/build.sh

# On a new machine the test bed and the images take about half an hour to build, and most tests do not need them.
# So the tests run in two groups, each as soon as what it needs is there, side by side with everything else: lint
# (which installs the venv), the test-bed build, the images, the first group (every test that needs neither the bed
# nor the images: unit, and integration on real Ray, TransferQueue and torch) as soon as the venv is there, and the
# second group (the tests that need the bed or the images: cluster (real API server), containers (the images, run by
# podman) and e2e) as soon as the bed and the images are built. On a warm machine both groups start at once: either
# alone leaves about a fifth of the 2 cores idle (their waits: deadlines, grace periods, a bed's start). On a new
# machine the builds are the way to the end (bed, then the second group), so they run at the tests' priority; only
# mypy and lint-imports, which nothing waits for, run lower (nice). Each group's lines carry its name (`unit+ray |`, `bed |`), since the two write at the same time (no
# --output-sync: it would hold each log until its target ends). `-k`: a group runs even when another target failed,
# so one run shows every failure; `make test` fails if anything did. The two marker expressions are each other's
# complement: every test runs once.
BED_TESTS := cluster or containers

test:
	@$(MAKE) --no-print-directory -k -j5 lint testbed images test-without-bed test-with-bed LINT_NICE="nice -n 10" \
		GROUP_PREFIX=1

# GROUP_PREFIX=1 (set by `make test`): each line of a group's output starts with the group's name.
prefix = $(if $(GROUP_PREFIX),2>&1 | sed -u 's/^/$(1) | /',)

test-without-bed: install
	set -o pipefail; $(PY) -m pytest -m "not ($(BED_TESTS))" $(call prefix,unit+ray)

test-with-bed: install testbed images
	set -o pipefail; TESTBED_CACHE=$(TESTBED_CACHE) $(PY) -m pytest -m "$(BED_TESTS)" $(call prefix,bed)

test-unit: install
	$(PY) -m pytest tests/unit

# mypy --strict on both packages, the import contracts (pyproject.toml), ruff's formatting and its lint rules.
lint: install
	$(LINT_NICE) $(PY) -m mypy operator/trainingrun_operator runtime/trainingrun_runtime
	$(LINT_NICE) $(VENV)/bin/lint-imports
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

bench: install testbed
	TESTBED_CACHE=$(TESTBED_CACHE) $(PY) bench/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache bench-results.json
