"""The Helm chart (charts/trainingrun) as the cluster tests render it: with the test bed's pinned helm.

chart.render(control_plane, "release", "namespace", "--set", "metrics.prometheusRule.enabled=true")
chart.by_kind(rendered)["PrometheusRule"]
"""

from __future__ import annotations

import subprocess
from typing import Any

import yaml

from support.operator_double import REPO

CHART = REPO / "charts" / "trainingrun"


def helm(control_plane: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(control_plane.bin_dir / "helm"), *args], capture_output=True, text=True, timeout=120)


def render(control_plane: Any, release: str, namespace: str, *sets: str) -> str:
    """`helm template` of the chart for a cluster of the bed's Kubernetes minor; fails the test if helm does."""
    result = helm(
        control_plane, "template", release, str(CHART), "--namespace", namespace, "--kube-version", "1.35.0", *sets
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def by_kind(rendered: str) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in yaml.safe_load_all(rendered) if d}
