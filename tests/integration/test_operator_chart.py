"""The Helm chart on a real API server: lint, server-side dry-run of the rendered chart (its ServiceMonitor and
PrometheusRule against the Prometheus Operator's own CRDs), the metrics Service wired to the operator's port, no
drift with manifests/, and least privilege for real — the operator runs the preemption journey with a token minted
for the chart's ServiceAccount, bound by the chart's ClusterRole, not as an admin."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from typing import Any

import pytest
import yaml

import binaries
from support import dashboards
from support.chart import CHART, by_kind, helm, render
from support.operator_double import (
    REPO,
    Cluster,
    InProcessOperator,
    KubeRayDouble,
    eventually,
    tiny_run,
)

pytestmark = pytest.mark.cluster


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
        "Service",
        "ServiceAccount",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicyBinding",
    ]
    result = control_plane.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered, check=False)
    assert result.returncode == 0, result.stderr


def test_the_metrics_service_and_servicemonitor_reach_the_operators_metrics_port(
    control_plane: Any, namespace: str
) -> None:
    """The ServiceMonitor (behind metrics.serviceMonitor.enabled) names the Service's port, selects the Service,
    which selects the operator's pod and targets the container port the operator serves /metrics on; the
    Prometheus Operator's ServiceMonitor CRD (from its Go module, pinned in pins.env) accepts it."""
    assert "ServiceMonitor" not in by_kind(render(control_plane, "sm", namespace)), "off by default"
    rendered = render(
        control_plane,
        "sm",
        namespace,
        "--set",
        "metrics.port=9123",
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.serviceMonitor.labels.release=kube-prometheus-stack",
        "--set",
        "networkPolicy.enabled=false",
    )
    kinds = by_kind(rendered)
    monitor, service, deployment = kinds["ServiceMonitor"], kinds["Service"], kinds["Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "--metrics-address=0.0.0.0:9123" in container["args"]
    assert {"name": "metrics", "containerPort": 9123} in container["ports"]
    (port,) = service["spec"]["ports"]
    assert (port["name"], port["port"], port["targetPort"]) == ("metrics", 9123, "metrics")
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [namespace]}
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"

    control_plane.install_crds([binaries.Binaries.locate().service_monitor_crd])
    result = control_plane.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered, check=False)
    assert result.returncode == 0, result.stderr
    assert "servicemonitor.monitoring.coreos.com/sm-trainingrun created (server dry run)" in result.stdout

    disabled = by_kind(render(control_plane, "sm", namespace, "--set", "metrics.enabled=false"))
    assert "Service" not in disabled and "ServiceMonitor" not in disabled
    (container,) = disabled["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert "--metrics-address=" in container["args"], "no server: the operator is told so"


def test_the_prometheusrule_carries_the_alerts_with_the_values_thresholds_and_the_crd_accepts_it(
    control_plane: Any, namespace: str
) -> None:
    """Behind metrics.prometheusRule.enabled, the alerts of docs/operating.md as a PrometheusRule, accepted by the
    Prometheus Operator's own CRD in a server-side dry run (test_operator_metrics loads the same rules into a real
    Prometheus and sees them fire)."""
    assert "PrometheusRule" not in by_kind(render(control_plane, "pr", namespace)), "off by default"
    rendered = render(
        control_plane,
        "pr",
        namespace,
        "--set",
        "metrics.prometheusRule.enabled=true",
        "--set",
        "metrics.prometheusRule.labels.release=kube-prometheus-stack",
        "--set",
        "metrics.prometheusRule.checkpointStaleSeconds=7200",
        "--set",
        "metrics.prometheusRule.notRunningFor=45m",
        "--set",
        "metrics.prometheusRule.goodputBelow=0.7",
    )
    rule = by_kind(rendered)["PrometheusRule"]
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (group,) = rule["spec"]["groups"]
    alerts = {r["alert"]: r for r in group["rules"]}
    assert sorted(alerts) == [
        "TrainingRunAttemptsFailing",
        "TrainingRunCheckpointStale",
        "TrainingRunFailed",
        "TrainingRunLosingSteps",
        "TrainingRunLowGoodput",
        "TrainingRunNotRunning",
        "TrainingRunPreemptedOften",
    ]
    assert alerts["TrainingRunCheckpointStale"]["expr"].endswith("> 7200")
    assert alerts["TrainingRunNotRunning"]["for"] == "45m"
    assert ") < 0.7\nand on (namespace, name)" in alerts["TrainingRunLowGoodput"]["expr"]
    assert "{{ $labels.namespace }}/{{ $labels.name }}" in alerts["TrainingRunFailed"]["annotations"]["summary"]

    control_plane.install_crds([binaries.Binaries.locate().prometheus_rule_crd])
    result = control_plane.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered, check=False)
    assert result.returncode == 0, result.stderr
    assert "prometheusrule.monitoring.coreos.com/pr-trainingrun created (server dry run)" in result.stdout
    assert "PrometheusRule" not in by_kind(
        render(control_plane, "pr", namespace, "--set", "metrics.prometheusRule.enabled=true", "--set",
               "metrics.enabled=false")
    ), "no metrics, no rules"  # fmt: skip


def test_the_grafana_dashboard_ships_as_a_configmap_for_the_sidecar_when_asked(
    control_plane: Any, namespace: str
) -> None:
    def dashboards_in(rendered: str) -> list[dict[str, Any]]:
        docs = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "ConfigMap"]
        return [d for d in docs if "trainingrun.json" in d.get("data", {})]  # not the pod security allow-list

    assert dashboards_in(render(control_plane, "gd", namespace)) == [], "off by default"
    rendered = render(control_plane, "gd", namespace, "--set", "metrics.grafanaDashboard.enabled=true")
    (configmap,) = dashboards_in(rendered)
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(configmap["data"]["trainingrun.json"]) == dashboards.load()
    result = control_plane.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered, check=False)
    assert result.returncode == 0, result.stderr


def test_the_operators_own_network_policy_admits_its_metrics_port_only_from_the_named_namespaces(
    control_plane: Any, namespace: str
) -> None:
    """The chart's NetworkPolicy is the operator pod's own (each run's Ray pods get one from the operator,
    `netpolicy.py`): closed by default, its /metrics port open to the namespaces the admin names, and the
    operator told where KubeRay runs."""
    closed, scraped = (
        by_kind(render(control_plane, "np", namespace, "--set", f"watchNamespaces={{{namespace}}}", *extra))
        for extra in ([], ["--set-json", 'networkPolicy.metricsNamespaces=["monitoring"]'])
    )
    assert closed["NetworkPolicy"]["spec"]["ingress"] == []
    assert (
        closed["NetworkPolicy"]["spec"]["podSelector"]["matchLabels"]
        == (closed["Deployment"]["spec"]["selector"]["matchLabels"])
    )
    [rule] = scraped["NetworkPolicy"]["spec"]["ingress"]
    ports = {
        p["name"]: p["containerPort"]
        for p in scraped["Deployment"]["spec"]["template"]["spec"]["containers"][0]["ports"]
    }
    assert rule["ports"] == [{"protocol": "TCP", "port": ports["metrics"]}]  # not the health port
    assert rule["from"][0]["namespaceSelector"]["matchExpressions"][0]["values"] == ["monitoring"]
    args = scraped["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--kuberay-namespace=ray-system" in args and "--metrics-namespace=monitoring" in args
    assert "--kuberay-label=app.kubernetes.io/name=kuberay-operator" in args
    rules = [r for r in closed["ClusterRole"]["rules"] if "networkpolicies" in r["resources"]]
    assert rules == [
        {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["create", "get", "patch"]}
    ]
    gone = helm(
        control_plane, "template", "np", str(CHART), "--kube-version", "1.35.0",
        "--set", f"watchNamespaces={{{namespace}}}", "--set", "networkPolicy.dashboardPort=8265",
    )  # fmt: skip
    assert gone.returncode != 0 and "networkPolicy.metricsNamespaces" in gone.stderr


LISTS = ("capabilities", "hostPaths")
"""The policy's variables that hold the allow-list (`allowance.AllowList`)."""


def test_the_pod_security_allow_list_reaches_the_policys_expressions_and_the_operators_flags_alike(
    control_plane: Any, namespace: str
) -> None:
    """podSecurity.allow: the same normalized lists in the admission policy's expressions and in the operator's
    flags (which parse to the same allowance); an entry that cannot be one fails the render, naming it."""
    text = render(
        control_plane, "ps", namespace,
        "--set-json", 'podSecurity.allow.capabilities=["IPC_LOCK","SYS_RESOURCE"]',
        "--set-json", 'podSecurity.allow.hostPaths=["/dev/infiniband/","/opt/drivers"]',
    )  # fmt: skip
    rendered = by_kind(text)

    def lists(docs: str) -> dict[str, str]:
        (policy,) = [
            d
            for d in yaml.safe_load_all(docs)
            if d and d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"].endswith("-pod-security")
        ]
        return {v["name"]: v["expression"] for v in policy["spec"]["variables"] if v["name"] in LISTS}

    empty = {"capabilities": "''.split(',').filter(c, c != '')", "hostPaths": "''.split(',').filter(p, p != '')"}
    assert lists(render(control_plane, "ps", namespace)) == empty, "empty by default"
    assert lists(text) == {
        "capabilities": "'IPC_LOCK,SYS_RESOURCE'.split(',').filter(c, c != '')",
        "hostPaths": "'/dev/infiniband,/opt/drivers'.split(',').filter(p, p != '')",
    }
    args = rendered["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--allow-capabilities=IPC_LOCK,SYS_RESOURCE" in args
    assert "--allow-host-paths=/dev/infiniband,/opt/drivers" in args
    for values, says in (
        ('podSecurity.allow.hostPaths=["/"]', 'podSecurity.allow.hostPaths: "/"'),
        ('podSecurity.allow.hostPaths=["/dev/../etc"]', 'podSecurity.allow.hostPaths: "/dev/../etc"'),
        ('podSecurity.allow.capabilities=["ALL"]', 'podSecurity.allow.capabilities: "ALL"'),
        ('podSecurity.allow.hostPaths=["/dev/a\'b"]', 'podSecurity.allow.hostPaths: "/dev/a\'b"'),
    ):
        refused = helm(control_plane, "template", "ps", str(CHART), "--kube-version", "1.35.0", "--set-json", values)
        assert refused.returncode != 0 and says in refused.stderr, refused.stderr


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
    cluster.events_with("tiny", "CreatedRayJob")  # posted with the chart's RBAC
