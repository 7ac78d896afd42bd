"""What the operator's import contracts cannot say: the pure core never reads the clock (`now` is an argument).

The layering itself (kopf only in kube.handlers, the Kubernetes client only in kube.apiclient, prometheus_client
only in kube.metrics, a core without I/O libraries, kube and localmode above the core and apart) is import-linter's
contracts in pyproject.toml, run by `lint-imports` (and tests/unit/test_layering.py).
"""

from __future__ import annotations

import pathlib
import re

CORE = pathlib.Path(__file__).resolve().parents[3] / "operator" / "trainingrun_operator" / "core"


def test_the_decision_core_never_reads_the_clock() -> None:
    modules = sorted(CORE.glob("*.py"))
    assert any(path.name == "decision.py" for path in modules), f"no decision.py in {CORE}"
    readers = [
        path.name
        for path in modules
        if re.search(r"datetime\.now\(|\btime\.(time|monotonic)\(|utcnow\(", path.read_text())
    ]
    assert readers == []
