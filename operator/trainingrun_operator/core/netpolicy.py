"""The run's NetworkPolicy: what may reach the Ray pods of one TrainingRun. A pure builder.

Called by `reconciler.py` beside the status write of every pass that creates an attempt's RayJob, so the policy
exists before the RayJob does, and once per operator process for a run whose pods are up (a run from before the
operator made policies is closed then, not at its next attempt); `apiclient.py` sends it.

One per run, not per attempt: every pod of every attempt carries the run's label, so one policy covers the run
from its first pod to its last (an ended attempt's pods going away included), and no attempt waits for a policy of
its own. The garbage collector deletes it with the run (its owner reference), which can be before the run's last
pods have stopped: `reconciler.finalize` waits for none.

    NetworkPolicy <run>-ray   owner: the TrainingRun; podSelector trainingrun.dev/run=<run>; policyTypes [Ingress]
      from the run's own pods            every port (GCS 6379, client 10001, object and node managers, workers,
                                         agents, the dashboard): they are one Ray cluster already
      from KubeRay's pods (`Sources`)    the head's dashboard port (rayStartParams dashboard-port, 8265): the job
                                         API, where KubeRay submits the driver (HTTPMode) and reads its status
      from the admin's namespaces        Ray's metrics port of each group (metrics-export-port, 8080); none named:
                                         closed
      from anyone else                   nothing
    Egress is not restricted: the driver reaches the API server, the pods reach images, data and each other.

A NetworkPolicy admits by labels, so the policy is as strong as the labels are. No run can pass for another: the
operator labels every Ray pod with its run, and a template fragment that sets that label is refused
(`podtemplate.RULES`); KubeRay's labels, which a fragment may set, admit no pod with a run label. Whoever may
create or label pods in the namespace, or create RayClusters there (KubeRay makes their pods), can forge either.
Policies add up: any other policy that selects these pods and admits more opens them (the operator's own cannot
close what another opens).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from trainingrun_operator.core import model, naming
from trainingrun_operator.core.rayjob import owner_reference

__all__ = [
    "DASHBOARD_PORT",
    "DEFAULT",
    "KUBERAY_LABELS",
    "METRICS_PORT",
    "Sources",
    "build",
    "name",
    "ports",
]

API_VERSION = "networking.k8s.io/v1"
KIND = "NetworkPolicy"
DASHBOARD_PORT = 8265
"""KubeRay's default dashboard port (the job API); `rayStartParams.dashboard-port` of the head moves it."""
METRICS_PORT = 8080
"""The metrics port KubeRay gives every Ray pod (`--metrics-export-port`) unless a group's rayStartParams sets it."""
KUBERAY_LABELS: Mapping[str, str] = {"app.kubernetes.io/name": "kuberay-operator"}
"""The labels of the KubeRay operator's pods as KubeRay's Helm chart sets them."""
NAMESPACE_LABEL = "kubernetes.io/metadata.name"
"""The label the API server puts on every namespace: its name."""


@dataclasses.dataclass(frozen=True)
class Sources:
    """Who, besides the run's own pods, may reach them: the operator's settings (`trainingrun operator` flags)."""

    kuberay_labels: Mapping[str, str] = dataclasses.field(default_factory=lambda: dict(KUBERAY_LABELS))
    """Labels of the KubeRay operator's pods (all of them must match); never empty."""
    kuberay_namespace: str | None = None
    """The KubeRay operator's namespace; None: any namespace (its labels alone say which pods are KubeRay's)."""
    metrics_namespaces: tuple[str, ...] = ()
    """Namespaces whose pods may scrape Ray's metrics port (your Prometheus'); empty: none may."""

    def __post_init__(self) -> None:
        if not self.kuberay_labels:
            raise ValueError("netpolicy.Sources: no KubeRay labels (every pod that is not a run's would match)")


DEFAULT = Sources()
"""The operator's default: KubeRay's pods by KubeRay's Helm chart labels in any namespace; no one scrapes."""


def name(run: str) -> str:
    """`<run>-ray`: at most 44 characters for a run name of at most 40 (the CRD enforces it)."""
    return f"{run}-ray"


def _port(params: Mapping[str, str] | None, key: str, default: int) -> int:
    """The port `ray start --<key>` is given, if it is one; else `default` (what KubeRay or Ray would use)."""
    value = (params or {}).get(key, "").strip()
    return int(value) if value.isascii() and value.isdigit() and 0 < int(value) < 65536 else default


def ports(spec: model.TrainingRunSpec) -> tuple[int, tuple[int, ...]]:
    """The head's dashboard port, and the metrics ports of the run's groups (the dashboard port left out: the job
    API runs code, it is never opened for scraping)."""
    dashboard = _port(spec.ray.head.ray_start_params, "dashboard-port", DASHBOARD_PORT)
    groups = [spec.ray.head.ray_start_params, *(group.ray_start_params for group in spec.ray.workers or [])]
    metrics = {_port(params, "metrics-export-port", METRICS_PORT) for params in groups}
    return dashboard, tuple(sorted(metrics - {dashboard}))


def _tcp(ports_: Iterable[int]) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": port} for port in ports_]


def _kuberay(sources: Sources) -> dict[str, Any]:
    """The KubeRay operator's pods: its labels and no run label (a run's pod may wear KubeRay's labels)."""
    where = {} if sources.kuberay_namespace is None else {"matchLabels": {NAMESPACE_LABEL: sources.kuberay_namespace}}
    return {
        "namespaceSelector": where,  # {}: every namespace; without it, only the run's own
        "podSelector": {
            "matchLabels": dict(sources.kuberay_labels),
            "matchExpressions": [{"key": naming.LABEL_RUN, "operator": "DoesNotExist"}],
        },
    }


def build(run: str, namespace: str, uid: str, spec: model.TrainingRunSpec, sources: Sources) -> dict[str, Any]:
    """The NetworkPolicy of TrainingRun `run` (uid `uid`): its pods admit the run's own pods on every port, KubeRay's
    on the dashboard port, `sources.metrics_namespaces` on the metrics ports, and nothing else."""
    own = {naming.LABEL_RUN: run}
    dashboard, metrics = ports(spec)
    ingress: list[dict[str, Any]] = [
        {"from": [{"podSelector": {"matchLabels": dict(own)}}]},
        {"from": [_kuberay(sources)], "ports": _tcp([dashboard])},
    ]
    if sources.metrics_namespaces and metrics:
        scrapers = {"key": NAMESPACE_LABEL, "operator": "In", "values": sorted(set(sources.metrics_namespaces))}
        ingress.append({"from": [{"namespaceSelector": {"matchExpressions": [scrapers]}}], "ports": _tcp(metrics)})
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": name(run),
            "namespace": namespace,
            "labels": {naming.LABEL_RUN: run, naming.LABEL_MANAGED_BY: naming.MANAGED_BY},
            "ownerReferences": [owner_reference(run, uid)],
        },
        "spec": {"podSelector": {"matchLabels": own}, "policyTypes": ["Ingress"], "ingress": ingress},
    }
