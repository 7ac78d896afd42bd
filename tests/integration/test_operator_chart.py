"""The Helm chart on a real API server: lint, server-side dry-run of the rendered chart, no drift with
manifests/, and least privilege for real — the operator runs the preemption journey with a token minted for
the chart's ServiceAccount, bound by the chart's ClusterRole, not as an admin."""

from __future__ import annotations

import logging
import subprocess
import sys
from typing import Any

import pytest
import yaml

from support.operator_double import (
    REPO,
    Cluster,
    InProcessOperator,
    KubeRayDouble,
    eventually,
    tiny_run,
)

pytestmark = pytest.mark.cluster

CHART = REPO / "charts" / "trainingrun"


def helm(control_plane: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(control_plane.bin_dir / "helm"), *args], capture_output=True, text=True, timeout=120)


def render(control_plane: Any, release: str, namespace: str, *sets: str) -> str:
    result = helm(
        control_plane, "template", release, str(CHART), "--namespace", namespace, "--kube-version", "1.35.0", *sets
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_helm_lint_passes(control_plane: Any) -> None:
    for values in ([], ["--set", "watchNamespaces={a,b}", "--set", "peering.enabled=true"]):
        result = helm(control_plane, "lint", str(CHART), "--strict", *values)
        assert result.returncode == 0, result.stdout + result.stderr


def test_the_rendered_chart_applies_with_a_server_side_dry_run(control_plane: Any, namespace: str) -> None:
    rendered = render(control_plane, "dry", namespace, "--set", f"watchNamespaces={{{namespace}}}", "--include-crds")
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(rendered) if d)
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "Deployment",
        "NetworkPolicy",
        "ServiceAccount",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    result = control_plane.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered, check=False)
    assert result.returncode == 0, result.stderr


def test_manifests_do_not_drift_from_the_chart(control_plane: Any) -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "operator" / "sync_manifests.py"), "--check"],
        capture_output=True,
        text=True,
        env={"HELM": str(control_plane.bin_dir / "helm"), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr


def test_the_operator_runs_the_preemption_journey_with_only_the_charts_rbac(
    control_plane: Any, namespace: str, cluster: Cluster, kuberay: KubeRayDouble, caplog: pytest.LogCaptureFixture
) -> None:
    release = f"lp-{namespace[-5:]}"
    rendered = render(
        control_plane,
        release,
        namespace,
        "--set",
        f"watchNamespaces={{{namespace}}}",
        "--set",
        "networkPolicy.enabled=false",
    )
    rbac = [
        d
        for d in yaml.safe_load_all(rendered)
        if d and d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")
    ]
    assert len(rbac) == 3
    control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rbac))
    sa = next(d["metadata"]["name"] for d in rbac if d["kind"] == "ServiceAccount")
    token = control_plane.service_account_kubeconfig(namespace, sa)
    caplog.set_level(logging.WARNING)
    operator = InProcessOperator(token, namespace).start()
    try:
        cluster.apply_run(tiny_run())
        kuberay.start("tiny-a1")
        eventually(lambda: cluster.status("tiny").get("phase") == "Running", what="phase Running")
        cluster.report("tiny", attempt=1, step=10)
        eventually(lambda: (cluster.status("tiny").get("checkpoints") or {}).get("latest"), what="checkpoint recorded")
        kuberay.preempt_head("tiny-a1")
        job = eventually(
            lambda: cluster.rayjob("tiny-a2"), what="RayJob tiny-a2 created by the least-privileged operator"
        )
        assert "--resume 10" in job["spec"]["entrypoint"]
        control_plane.kubectl("delete", "trun", "tiny", "-n", namespace, "--wait=true", "--timeout=45s")
        eventually(lambda: not cluster.rayjobs(), what="RayJobs removed on deletion")
    finally:
        operator.stop()
        control_plane.kubectl("delete", "clusterrolebinding,clusterrole", f"{release}-trainingrun", check=False)
    # Our errors read "...: 403 Forbidden: ...", kopf's "APIForbiddenError(... is forbidden ...)". (Not a bare
    # "403": the namespace's random suffix can contain it.)
    forbidden = [r.getMessage() for r in caplog.records if "orbidden" in r.getMessage()]
    assert forbidden == []
    assert cluster.events("tiny"), "events were posted with the chart's RBAC"
