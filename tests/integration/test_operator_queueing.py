"""Queueing with Kueue, against a real API server with the operator in-process, the test playing Kueue's admission
(a merge patch of the RayJob's spec.suspend, which is all Kueue does to a RayJob when it admits or evicts it) and
KubeRay played by the double of test_operator_double.py. test_operator_kueue.py runs the same journey with the real
Kueue controller deciding admission from a ClusterQueue's quota.

- a run labelled kueue.x-k8s.io/queue-name and kueue.x-k8s.io/priority-class: its RayJob is created suspended, with
  both labels; the run is Queued, its Queued condition names the LocalQueue; `kubectl get` shows the phase;
- admitted (spec.suspend false): Starting, status.attempt.admitted set; then Running, nothing charged for the wait;
- suspended again by the queue while running: Preempted (the preemption budget), and attempt 2 waits in the queue;
- a queued run whose spec breaks Kueue's rules (8 worker groups) fails at once, naming the field and the label,
  while the same spec without the label is accepted by the API server and runs.

Everything asserted is read back through the API server: status, conditions, events and RayJob objects.
"""

from __future__ import annotations

from typing import Any

import pytest

from support.operator_double import Cluster, InProcessOperator, KubeRayDouble, eventually, phase_is, tiny_run

pytestmark = pytest.mark.cluster

QUEUE_LABELS = {"kueue.x-k8s.io/queue-name": "team-a", "kueue.x-k8s.io/priority-class": "high"}


def queued_run(name: str = "tiny", **spec: Any) -> dict[str, Any]:
    doc = tiny_run(name, **spec)
    doc["metadata"]["labels"] = dict(QUEUE_LABELS)
    return doc


def set_suspend(cluster: Cluster, name: str, suspend: bool) -> None:
    """What Kueue does to a RayJob: spec.suspend false when it admits it, true when it evicts or preempts it."""
    cluster.custom.patch_namespaced_custom_object(
        "ray.io",
        "v1",
        cluster.namespace,
        "rayjobs",
        name,
        {"spec": {"suspend": suspend}},
        _content_type="application/merge-patch+json",
    )


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status.get("conditions") or [] if c["type"] == kind)


def test_a_queued_run_waits_as_queued_until_admitted_then_runs_and_a_suspend_after_admission_is_a_preemption(
    cluster: Cluster, kuberay: KubeRayDouble, operator: InProcessOperator
) -> None:
    cluster.apply_run(queued_run())
    status = eventually(lambda: phase_is(cluster, "tiny", "Queued"), what="run Queued")
    queued = condition(status, "Queued")
    assert queued["status"] == "True" and "LocalQueue team-a" in queued["message"], queued
    job = eventually(lambda: cluster.rayjob("tiny-a1"), what="RayJob tiny-a1")
    assert job["spec"]["suspend"] is True, "created suspended, as Kueue's webhook would"
    assert QUEUE_LABELS.items() <= job["metadata"]["labels"].items()
    shown = cluster.plane.kubectl("get", "trainingrun", "tiny", "-n", cluster.namespace, "--no-headers").stdout
    assert shown.split()[1] == "Queued", shown
    assert "Queued" in cluster.events("tiny")
    assert cluster.pods("trainingrun.dev/run=tiny") == [], "nothing runs while queued"

    set_suspend(cluster, "tiny-a1", False)  # admitted
    status = eventually(lambda: phase_is(cluster, "tiny", "Starting"), what="run Starting after admission")
    assert status["attempt"]["admitted"], status["attempt"]
    assert condition(status, "Queued")["status"] == "False"
    kuberay.start("tiny-a1")
    status = eventually(lambda: phase_is(cluster, "tiny", "Running"), what="run Running")
    assert status["restarts"]["total"] == 0 and not status.get("consecutiveFailures"), "the wait cost nothing"
    assert "Admitted" in cluster.events("tiny")

    set_suspend(cluster, "tiny-a1", True)  # evicted by the queue (a higher-priority workload took the quota)
    job2 = eventually(lambda: cluster.rayjob("tiny-a2"), what="RayJob tiny-a2 after the queue suspended attempt 1")
    assert job2["spec"]["suspend"] is True and QUEUE_LABELS.items() <= job2["metadata"]["labels"].items()
    status = eventually(lambda: phase_is(cluster, "tiny", "Queued"), what="attempt 2 Queued")
    first = status["attempts"][0]
    assert first["reason"] == "Preempted" and "suspended by a queue" in first["message"], first
    assert status["restarts"]["preempted"] == 1 and status["restarts"]["total"] == 1


def test_a_queued_run_that_breaks_kueues_rules_fails_naming_the_field_and_the_label(
    cluster: Cluster, operator: InProcessOperator
) -> None:
    workers = [{"name": f"g{i}", "replicas": 1} for i in range(8)]
    cluster.apply_run(queued_run("many", ray={"head": {}, "workers": workers}))
    cluster.apply_run(tiny_run("unqueued", ray={"head": {}, "workers": workers}))
    status = eventually(lambda: phase_is(cluster, "many", "Failed"), what="queued run Failed")
    assert status["reason"] == "InvalidSpec", status
    assert status["message"].startswith("spec.ray.workers: 8 worker groups"), status["message"]
    assert "kueue.x-k8s.io/queue-name" in status["message"]
    assert cluster.rayjob("many-a1") is None, "no RayJob for Kueue to refuse"
    eventually(lambda: phase_is(cluster, "unqueued", "Starting"), what="the same spec without the label starts")
