"""Queueing with the real Kueue controller (sigs.k8s.io/kueue at the pinned KUEUE_VERSION, built by `make testbed`;
hack/testbed/kueue.py: the RayJob integration only, webhooks and leader election off) against the real API server,
with the operator in-process and KubeRay played by the double of test_operator_double.py. Kueue reads a RayJob's pod
sets from its spec and its progress from its status (Running, Complete), which the double writes as KubeRay does.
Unlike KubeRay, the double leaves a suspended RayJob's status empty (New) instead of walking it to Suspended; Kueue
treats both alike (not active), and the decision's unit tests walk KubeRay's states.

A ClusterQueue whose quota (3 CPUs, 6Gi) fits one tiny run's head (2 CPUs, 4Gi) and not two, a LocalQueue team-a in
the test's namespace, a WorkloadPriorityClass:
- the first queued run: Kueue admits its RayJob (unsuspends it): Starting, then Running;
- the second: Kueue finds no quota (its Workload's QuotaReserved is False, Pending): the run stays Queued, its Queued
  condition naming the LocalQueue, its RayJob suspended and no pod made, nothing charged;
- the first run succeeds (its RayJob Complete: Kueue finishes its Workload and frees the quota): Kueue admits the
  second, which starts and runs.

With preemption within the ClusterQueue on, a run of a higher WorkloadPriorityClass makes Kueue evict a running
lower-priority one (it suspends its RayJob): that run's attempt ends as Preempted (the preemption budget), its next
attempt waits in the queue, and the higher-priority run is admitted.

test_operator_queueing.py covers the rest (preemption, suspension, Kueue's rules) with the test playing Kueue.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pytest

import kueue as kueue_bed
from support.operator_double import Cluster, InProcessOperator, KubeRayDouble, eventually, phase_is, tiny_run
from trainingrun_runtime import timestamps

pytestmark = pytest.mark.cluster

LABELS = {"kueue.x-k8s.io/queue-name": "team-a", "kueue.x-k8s.io/priority-class": "batch-high"}


@pytest.fixture(scope="module")
def kueue(control_plane: Any) -> Iterator[kueue_bed.KueueController]:
    controller = kueue_bed.KueueController(control_plane).start()
    controller.priority_class("batch-high", 1000)
    controller.priority_class("batch-low", 100)
    try:
        yield controller
    finally:
        controller.stop()  # while it runs, it would suspend again what test_operator_queueing's "Kueue" unsuspends


def queued_run(name: str, priority: str = "batch-high") -> dict[str, Any]:
    doc = tiny_run(name)
    doc["metadata"]["labels"] = {**LABELS, "kueue.x-k8s.io/priority-class": priority}
    return doc


def workload_of(cluster: Cluster, rayjob: str) -> dict[str, Any] | None:
    """The Workload Kueue made for a RayJob (owned by it)."""
    items = cluster.custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", cluster.namespace, "workloads")
    return next(
        (w for w in items["items"] if any(o["name"] == rayjob for o in w["metadata"].get("ownerReferences") or [])),
        None,
    )


def quota_refused(cluster: Cluster, rayjob: str) -> dict[str, Any] | None:
    """The RayJob's Workload once Kueue has looked at it and found no quota (QuotaReserved False, Pending)."""
    workload = workload_of(cluster, rayjob)
    for cond in ((workload or {}).get("status") or {}).get("conditions") or []:
        if cond["type"] == "QuotaReserved" and cond["status"] == "False" and cond["reason"] == "Pending":
            return workload
    return None


def attempt_in(cluster: Cluster, run: str, number: int, phase: str) -> dict[str, Any] | None:
    """The run's status once its attempt `number` is in `phase`."""
    status = cluster.status(run)
    return status if (status.get("attempt") or {}).get("number") == number and status.get("phase") == phase else None


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status.get("conditions") or [] if c["type"] == kind)


def test_kueue_admits_one_queued_run_within_the_quota_and_the_next_once_the_first_has_finished(
    kueue: kueue_bed.KueueController, cluster: Cluster, kuberay: KubeRayDouble, operator: InProcessOperator
) -> None:
    kueue.queue(cluster.namespace, "team-a", {"cpu": "3", "memory": "6Gi"})

    cluster.apply_run(queued_run("first"))
    status = eventually(lambda: phase_is(cluster, "first", "Starting"), what=f"Kueue admits first\n{kueue.log_tail()}")
    assert status["attempt"]["admitted"]
    job = cluster.rayjob("first-a1")
    assert job is not None and not job["spec"].get("suspend"), "Kueue unsuspended the RayJob"
    workload = workload_of(cluster, "first-a1")
    assert workload is not None and workload["spec"].get("priority") == 1000, "the priority class label reached Kueue"
    kuberay.start("first-a1")
    eventually(lambda: phase_is(cluster, "first", "Running"), what="first Running")

    cluster.apply_run(queued_run("second"))
    eventually(lambda: quota_refused(cluster, "second-a1"), what="Kueue finds no quota for second")
    status = eventually(lambda: phase_is(cluster, "second", "Queued"), what="second Queued")
    queued = condition(status, "Queued")
    assert queued["status"] == "True" and "LocalQueue team-a" in queued["message"], queued
    job = cluster.rayjob("second-a1")
    assert job is not None and job["spec"]["suspend"] is True
    assert cluster.pods("trainingrun.dev/run=second") == [], "nothing of the queued run runs"
    assert "admitted" not in status["attempt"] and status["restarts"]["total"] == 0
    # the status keeps whole seconds: the queue's wait, the thing measured below, lasts at least two of them
    queued_from = timestamps.parse(status["attempt"]["start"])
    eventually(
        lambda: datetime.datetime.now(datetime.UTC) >= queued_from + datetime.timedelta(seconds=2),
        what="second queued 2 s",
    )

    kuberay.succeed("first-a1")  # Complete: Kueue marks the Workload finished and frees the quota
    eventually(lambda: phase_is(cluster, "first", "Succeeded"), what="first Succeeded")
    status = eventually(
        lambda: phase_is(cluster, "second", "Starting"), what=f"Kueue admits second\n{kueue.log_tail()}"
    )
    assert condition(status, "Queued")["status"] == "False"
    cluster.events_with("second", "Admitted")
    kuberay.start("second-a1")
    status = eventually(lambda: phase_is(cluster, "second", "Running"), what="second Running")
    assert status["restarts"]["total"] == 0 and not status.get("consecutiveFailures"), "the wait cost nothing"
    goodput = status["goodput"]  # the queue's wait is reported apart and counted against nothing
    assert goodput["queuedSeconds"] >= 1 and goodput["lostSeconds"]["start"] < goodput["queuedSeconds"], goodput


def test_kueue_preempting_a_running_lower_priority_run_is_a_preemption_and_its_next_attempt_queues_again(
    kueue: kueue_bed.KueueController, cluster: Cluster, kuberay: KubeRayDouble, operator: InProcessOperator
) -> None:
    kueue.queue(cluster.namespace, "team-a", {"cpu": "3", "memory": "6Gi"}, preempt_lower_priority=True)
    cluster.apply_run(queued_run("low", priority="batch-low"))
    eventually(lambda: phase_is(cluster, "low", "Starting"), what=f"Kueue admits low\n{kueue.log_tail()}")
    kuberay.start("low-a1")
    eventually(lambda: phase_is(cluster, "low", "Running"), what="low Running")

    cluster.apply_run(queued_run("high", priority="batch-high"))
    status = eventually(
        lambda: attempt_in(cluster, "low", 2, "Queued"),
        what=f"low preempted by Kueue, attempt 2 queued\n{kueue.log_tail()}",
    )
    first = status["attempts"][0]
    assert first["reason"] == "Preempted" and "suspended by a queue" in first["message"], first
    assert status["restarts"]["preempted"] == 1 and status["restarts"]["total"] == 1
    assert not status.get("consecutiveFailures"), "a preemption is not a failure"
    assert condition(status, "Queued")["status"] == "True"
    eventually(lambda: phase_is(cluster, "high", "Starting"), what=f"Kueue admits high\n{kueue.log_tail()}")
    job = cluster.rayjob("low-a2")
    assert job is not None and job["spec"]["suspend"] is True, "low's next attempt waits for the quota"
