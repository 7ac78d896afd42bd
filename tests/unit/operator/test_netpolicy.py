"""The run's NetworkPolicy builder: its name and owner, which pods it selects, who reaches them on which ports, and
that no run's pod can pass for KubeRay or for another run. The reconciler's use of it is in test_reconciler.py."""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from typing import Any

import kubernetes.client
import pytest
import yaml

from trainingrun_operator.core import model, naming, netpolicy, podtemplate, rayjob

EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / "manifests" / "examples"


def spec_of(example: str = "tiny.yaml", **ray: Any) -> model.TrainingRunSpec:
    docs = [d for d in yaml.safe_load_all((EXAMPLES / example).read_text()) if d and d["kind"] == "TrainingRun"]
    wire = docs[0]["spec"]
    wire["ray"].update(ray)
    return model.TrainingRunSpec.model_validate(wire)


def policy(spec: model.TrainingRunSpec | None = None, sources: netpolicy.Sources = netpolicy.DEFAULT) -> Any:
    return netpolicy.build("tiny", "ns", "u-1", spec or spec_of(), sources)


def rule_for(body: Mapping[str, Any], port: int) -> dict[str, Any]:
    (rule,) = [r for r in body["spec"]["ingress"] if {"protocol": "TCP", "port": port} in r.get("ports", [])]
    return dict(rule)


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether a LabelSelector selects an object with `labels` (as the API server reads one)."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        held = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[operator]
        if not held:
            return False
    return True


# --------------------------------------------------------------------------------------- the object


def test_the_policy_is_named_after_the_run_in_its_namespace_and_the_run_controls_it() -> None:
    meta = policy()["metadata"]
    assert (meta["name"], meta["namespace"]) == ("tiny-ray", "ns")
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "trainingrun.dev/v1alpha1",
            "kind": "TrainingRun",
            "name": "tiny",
            "uid": "u-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert meta["labels"] == {"trainingrun.dev/run": "tiny", "app.kubernetes.io/managed-by": "trainingrun-operator"}


def test_the_longest_run_name_gives_a_name_that_is_still_a_dns_label() -> None:
    longest = "r" * 40  # the CRD's limit on metadata.name
    assert len(netpolicy.name(longest)) == 44 <= 63
    assert netpolicy.name(longest) not in {naming.identity_name(longest), naming.rayjob_name(longest, 1)}


def test_the_policy_is_what_the_kubernetes_client_sends_field_for_field() -> None:
    """The client's NetworkPolicy model forbids unknown fields: a misspelt one fails here, and what the client
    serialises (what apiclient sends) is the builder's dict as it is."""
    body = policy(sources=netpolicy.Sources(kuberay_namespace="ray-system", metrics_namespaces=("monitoring",)))
    typed = kubernetes.client.V1NetworkPolicy.model_validate(body)
    assert kubernetes.client.ApiClient().sanitize_for_serialization(typed) == body


# -------------------------------------------------------------------------------- which pods, which way


def test_it_selects_every_pod_of_the_run_and_restricts_ingress_only() -> None:
    spec = policy()["spec"]
    assert spec["podSelector"] == {"matchLabels": {"trainingrun.dev/run": "tiny"}}
    assert spec["policyTypes"] == ["Ingress"] and "egress" not in spec, "the driver still reaches the API server"


def test_it_selects_the_pods_of_every_attempt_of_the_run_and_of_no_other_run() -> None:
    spec = spec_of("cluster.yaml")
    selector = netpolicy.build("tiny", "ns", "u-1", spec, netpolicy.DEFAULT)["spec"]["podSelector"]
    for attempt in (1, 2):
        cluster = rayjob.build_rayjob("tiny", "ns", "u-1", attempt, None, spec)["spec"]["rayClusterSpec"]
        templates = [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]
        assert len(templates) >= 2
        for template in templates:
            assert selects(selector, template["metadata"]["labels"])
    other = rayjob.build_rayjob("tiny-2", "ns", "u-2", 1, None, spec)["spec"]["rayClusterSpec"]["headGroupSpec"]
    assert not selects(selector, other["template"]["metadata"]["labels"])


def test_the_run_s_own_pods_reach_every_port_and_only_from_the_run_s_namespace() -> None:
    own, *others = policy()["spec"]["ingress"]
    assert own == {"from": [{"podSelector": {"matchLabels": {"trainingrun.dev/run": "tiny"}}}]}, "no ports: all"
    assert all(rule["ports"] for rule in others), "every other source reaches only the ports it names"


def test_no_run_can_label_its_pods_as_another_run_s() -> None:
    """The policy admits by the run label; the operator owns it: a template fragment that sets it is refused."""
    fragment = {"metadata": {"labels": {naming.LABEL_RUN: "victim"}}}
    for group in ("head", "worker"):
        (refusal,) = podtemplate.problems(fragment, group)
        assert "trainingrun.dev/run is set by the operator" in refusal.message


# ------------------------------------------------------------------------------------------- KubeRay


def test_the_dashboard_port_admits_kuberay_s_pods_in_any_namespace_by_default() -> None:
    rule = rule_for(policy(), 8265)
    assert rule["ports"] == [{"protocol": "TCP", "port": 8265}]
    (peer,) = rule["from"]
    assert peer["namespaceSelector"] == {}, "{}: every namespace (without it, only the run's own)"
    assert peer["podSelector"] == {
        "matchLabels": {"app.kubernetes.io/name": "kuberay-operator"},
        "matchExpressions": [{"key": "trainingrun.dev/run", "operator": "DoesNotExist"}],
    }


def test_the_kuberay_namespace_and_labels_come_from_the_settings() -> None:
    sources = netpolicy.Sources(kuberay_labels={"app": "kuberay", "tier": "operator"}, kuberay_namespace="ray-system")
    (peer,) = rule_for(policy(sources=sources), 8265)["from"]
    assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "ray-system"}}
    assert peer["podSelector"]["matchLabels"] == {"app": "kuberay", "tier": "operator"}


def test_no_run_s_pod_passes_for_kuberay_even_wearing_kuberay_s_labels() -> None:
    """A fragment may set any label but the operator's: a run's pod with KubeRay's labels still has its run label."""
    spec = spec_of(
        head={**spec_of().ray.head.wire(), "template": {"metadata": {"labels": dict(netpolicy.KUBERAY_LABELS)}}}
    )
    head = rayjob.build_rayjob("attacker", "ns", "u-9", 1, None, spec)["spec"]["rayClusterSpec"]["headGroupSpec"]
    labels = head["template"]["metadata"]["labels"]
    assert labels.items() >= netpolicy.KUBERAY_LABELS.items(), "the fragment's labels are on the pod"
    (peer,) = rule_for(policy(), 8265)["from"]
    assert not selects(peer["podSelector"], labels)
    assert selects(peer["podSelector"], {"app.kubernetes.io/name": "kuberay-operator", "pod-template-hash": "x"})


def test_sources_without_kuberay_labels_are_refused() -> None:
    with pytest.raises(ValueError, match="no KubeRay labels"):
        netpolicy.Sources(kuberay_labels={})


# ------------------------------------------------------------------------------------------- metrics


def test_the_metrics_port_is_closed_unless_the_admin_names_namespaces() -> None:
    body = policy()
    assert not [r for r in body["spec"]["ingress"] if {"protocol": "TCP", "port": 8080} in r.get("ports", [])]
    assert len(body["spec"]["ingress"]) == 2, "the run's own pods and KubeRay: nothing else"


def test_the_metrics_port_admits_the_pods_of_the_namespaces_the_settings_name_and_no_other_port() -> None:
    sources = netpolicy.Sources(metrics_namespaces=("monitoring", "obs", "monitoring"))
    rule = rule_for(policy(sources=sources), 8080)
    assert rule == {
        "from": [
            {
                "namespaceSelector": {
                    "matchExpressions": [
                        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["monitoring", "obs"]}
                    ]
                }
            }
        ],
        "ports": [{"protocol": "TCP", "port": 8080}],
    }


# --------------------------------------------------------------------------------------------- ports


def test_the_ports_follow_the_run_s_ray_start_params() -> None:
    spec = spec_of("cluster.yaml").wire()
    spec["ray"]["head"]["rayStartParams"] = {"dashboard-port": "9265", "metrics-export-port": "9090"}
    generation = spec["ray"]["workers"][0]
    spec["ray"]["workers"] = [
        {**generation, "rayStartParams": {"metrics-export-port": "9091"}},
        {**generation, "name": "more", "rayStartParams": {}},
    ]
    typed = model.TrainingRunSpec.model_validate(spec)
    assert netpolicy.ports(typed) == (9265, (8080, 9090, 9091)), "a group that names none has KubeRay's 8080"
    body = policy(typed, netpolicy.Sources(metrics_namespaces=("monitoring",)))
    assert rule_for(body, 9265)["from"][0]["podSelector"]["matchLabels"] == dict(netpolicy.KUBERAY_LABELS)
    assert rule_for(body, 8080) == rule_for(body, 9090) == rule_for(body, 9091)
    assert not [r for r in body["spec"]["ingress"] if {"protocol": "TCP", "port": 8265} in r.get("ports", [])]


def test_kuberay_s_ports_when_the_run_names_none() -> None:
    assert netpolicy.ports(spec_of()) == (8265, (8080,))


@pytest.mark.parametrize("value", ["", "0", "65536", "80a", "-1", "٨٠"])
def test_a_ray_start_param_that_is_not_a_port_leaves_kuberay_s_default(value: str) -> None:
    head = {**spec_of().ray.head.wire(), "rayStartParams": {"dashboard-port": value, "metrics-export-port": value}}
    assert netpolicy.ports(spec_of(head=head)) == (8265, (8080,))


def test_a_metrics_port_that_is_the_dashboard_port_is_never_opened_for_scraping() -> None:
    """The job API runs code: a group whose metrics-export-port is the dashboard port gets no scraping rule there."""
    head = {**spec_of().ray.head.wire(), "rayStartParams": {"metrics-export-port": "8265"}}
    body = policy(spec_of(head=head), netpolicy.Sources(metrics_namespaces=("monitoring",)))
    assert netpolicy.ports(spec_of(head=head)) == (8265, ())
    (dashboard,) = [r for r in body["spec"]["ingress"] if {"protocol": "TCP", "port": 8265} in r.get("ports", [])]
    assert "namespaceSelector" in dashboard["from"][0] and "podSelector" in dashboard["from"][0], "KubeRay's only"
    assert len(body["spec"]["ingress"]) == 2
