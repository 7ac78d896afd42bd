"""The operator's layering, checked on the source: kopf only in handlers.py, the Kubernetes client only at the
edge, and a pure core (no I/O libraries, no clock of its own)."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[3] / "operator" / "trainingrun_operator"
PURE = [
    "model",
    "phases",
    "observation",
    "classification",
    "restarts",
    "patching",
    "conditions",
    "naming",
    "validation",
    "decision",
    "watchdog",
    "rayjob",
    "podtemplate",
    "allowance",
    "identity",
    "netpolicy",
    "departures",
    "errors",
    "events",
    "figures",
]


def imported(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_only_handlers_imports_kopf() -> None:
    users = sorted(p.stem for p in PACKAGE.rglob("*.py") if "kopf" in imported(p))
    assert users == ["handlers"]


@pytest.mark.parametrize("module", PURE)
def test_pure_module_imports_no_kopf_kubernetes_subprocess_or_sockets(module: str) -> None:
    banned = {"kopf", "kubernetes", "subprocess", "socket", "asyncio", "aiohttp", "os", "time"}
    assert not imported(PACKAGE / "core" / f"{module}.py") & banned


def test_the_decision_core_never_reads_the_clock() -> None:
    source = (PACKAGE / "core" / "decision.py").read_text()
    assert not re.search(r"datetime\.now\(|\btime\.(time|monotonic)\(|utcnow\(", source)


def test_only_metrics_imports_prometheus_client() -> None:
    users = sorted(p.stem for p in PACKAGE.rglob("*.py") if "prometheus_client" in imported(p))
    assert users == ["metrics"]


def test_only_apiclient_talks_to_the_kubernetes_client() -> None:
    users = sorted(p.stem for p in PACKAGE.rglob("*.py") if "kubernetes" in imported(p))
    assert users == ["apiclient"]
