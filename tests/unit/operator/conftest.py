"""Fixtures of the operator's unit tests: OpenAPI -> JSON Schema, and KubeRay's real RayJob CRD schema; the
decision journeys' helper module (support.decisions) has its asserts rewritten.

KubeRay's CRD is never copied into this repository: it is read from the Go module cache where `make testbed`
downloads github.com/ray-project/kuberay/ray-operator@v1.5.0.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
import yaml

# The journeys of tests/unit/operator/test_decision_*.py assert inside support.decisions (the Store's pass, the
# start of an attempt): rewritten like the tests' own asserts, a failure there shows its values.
pytest.register_assert_rewrite("support.decisions")

KUBERAY_MODULE = "github.com/ray-project/kuberay/ray-operator@v1.5.0"
RAYJOB_CRD = "config/crd/bases/ray.io_rayjobs.yaml"


def as_jsonschema(node: Any, *, closed: bool = False) -> Any:
    """OpenAPI v3 (Kubernetes flavour) -> JSON Schema.

    `nullable` becomes a null type; `exclusiveMinimum: true` beside `minimum` becomes `exclusiveMinimum: <minimum>`
    (likewise for the maximum); x-kubernetes-* keys are dropped. With `closed`, objects that declare
    properties reject unknown ones (the API server would silently prune them: a typo would vanish).
    """
    if isinstance(node, list):
        return [as_jsonschema(item, closed=closed) for item in node]
    if not isinstance(node, dict):
        return node
    out = {
        k: as_jsonschema(v, closed=closed)
        for k, v in node.items()
        if not k.startswith("x-kubernetes-") and k != "nullable"
    }
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    for exclusive, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if node.get(exclusive) is True:  # OpenAPI 3.0's flag -> JSON Schema's number
            out[exclusive] = out.pop(bound)
    if (
        closed
        and "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def _module_dir_candidates() -> list[pathlib.Path]:
    found: list[pathlib.Path] = []
    if os.environ.get("KUBERAY_MODULE_DIR"):
        found.append(pathlib.Path(os.environ["KUBERAY_MODULE_DIR"]))
    cache = pathlib.Path(os.environ.get("TESTBED_CACHE", pathlib.Path.home() / ".cache" / "trainingrun"))
    for env in sorted(cache.glob("bin/*/paths.env")):
        for line in env.read_text().splitlines():
            if line.startswith("KUBERAY_MODULE_DIR="):
                found.append(pathlib.Path(line.split("=", 1)[1].strip().strip('"')))
    found.append(cache / "go" / "pkg" / "mod" / KUBERAY_MODULE)
    go = shutil.which("go") or "/usr/local/go/bin/go"
    if os.path.exists(go):
        modcache = subprocess.run([go, "env", "GOMODCACHE"], capture_output=True, text=True).stdout.strip()
        if modcache:
            found.append(pathlib.Path(modcache) / KUBERAY_MODULE)
    return found


@pytest.fixture(scope="session")
def kuberay_rayjob_crd() -> dict[str, Any]:
    """KubeRay v1.5.0's RayJob CRD, from the Go module cache."""
    for directory in _module_dir_candidates():
        path = directory / RAYJOB_CRD
        if path.is_file():
            doc = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
            assert isinstance(doc, dict)
            return doc
    pytest.fail(
        f"KubeRay's RayJob CRD ({KUBERAY_MODULE}/{RAYJOB_CRD}) is not in the Go module cache; "
        "run `make testbed` (it downloads the module) and run the tests again"
    )


@pytest.fixture(scope="session")
def openapi_to_jsonschema() -> Callable[..., Any]:
    return as_jsonschema
