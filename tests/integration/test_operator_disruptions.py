"""Disruptions other than the head's eviction, against a real API server with the operator in-process and KubeRay
played by the double of test_operator_double.py (see there for what it does and why it stands in for KubeRay here):

- the node under the head stops heartbeating (its own kwok process, playing its kubelet, is stopped): the real
  node lifecycle controller turns it NotReady; with the driver silent, the operator ends the attempt as Preempted
  at once, and attempt 2 starts only once the real pod garbage collector has removed the old pods (after the node
  is marked out of service); with the driver reporting, the attempt goes on until nodeNotReadySeconds have passed;
- a worker pod evicted through the Eviction API: the attempt goes on, one WorkerLost event, workersLost 1;
- the driver exits 4 (no generation worker came back in time): Preempted, attempt 2 resumes;
- a queue (Kueue) suspends the attempt's RayJob: Preempted, and attempt 2 resumes from the recorded step;
- the user suspends the TrainingRun: Suspended, no budget charged, checkpoints kept; unsuspended, the run
  resumes from the recorded step and can succeed.
- the driver stops reporting (the stall watchdog): its progress reports wake no one, so only the pass that the
  decision asked for at the deadline notices it; Stalled, the RayJob deleted, attempt 2 resumes.

Everything asserted is read back through the API server: status, conditions, events and RayJob objects.
"""

from __future__ import annotations

import datetime
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from support.operator_double import (
    Cluster,
    InProcessOperator,
    KubeRayDouble,
    args_of,
    eventually,
    phase_is,
    tiny_run,
)
from trainingrun_runtime import timestamps

pytestmark = pytest.mark.cluster

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
OUT_OF_SERVICE = {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status.get("conditions") or [] if c["type"] == kind)


def checkpoint_recorded(cluster: Cluster, run: str, step: int) -> dict[str, Any] | None:
    latest = (cluster.status(run).get("checkpoints") or {}).get("latest")
    return latest if latest and latest["step"] == step else None


def stays_absent(cluster: Cluster, rayjob: str, seconds: float) -> bool:
    """True if RayJob `rayjob` does not appear within `seconds` (the operator had time to act and did not)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cluster.rayjob(rayjob) is not None:
            return False
        time.sleep(0.2)
    return True


def running_with_checkpoint(cluster: Cluster, kuberay: KubeRayDouble, step: int, **spec: Any) -> None:
    """Attempt 1 of `tiny` (spec fields replaced by `spec`) running, with a checkpoint at `step` recorded from its
    report (dated 2025: as far as the operator can tell, the driver has been silent since)."""
    cluster.apply_run(tiny_run(**spec))
    kuberay.start("tiny-a1")
    eventually(lambda: phase_is(cluster, "tiny", "Running"), what="attempt 1 Running")
    cluster.report("tiny", attempt=1, step=step)
    eventually(lambda: checkpoint_recorded(cluster, "tiny", step), what=f"checkpoint step {step} recorded")


@pytest.fixture
def doomed_node(control_plane: Any) -> Iterator[tuple[str, Any]]:
    """A node of its own with its own kwok (its kubelet): stopping that process is the node dying."""
    name = f"doomed-{uuid.uuid4().hex[:6]}"
    # Tainted so that no other test's scheduled pod lands here; the double binds pods by nodeName.
    taint = {"key": "trainingrun.dev/testbed", "value": name, "effect": "NoSchedule"}
    control_plane.create_fake_node(name, taints=[taint], annotations={KWOK_ANNOTATION: name})
    kubelet = control_plane.start_kwok(manage_single_node=name, name=f"kwok-{name}")
    try:
        control_plane.wait_nodes_ready([name])
        yield name, kubelet
    finally:
        kubelet.stop()
        control_plane.kubectl("delete", "node", name, "--ignore-not-found", "--wait=false", check=False)


def test_a_head_on_a_node_that_turns_not_ready_is_preempted_and_attempt_two_waits_for_the_old_pods(
    control_plane: Any,
    cluster: Cluster,
    kuberay: KubeRayDouble,
    operator: InProcessOperator,
    doomed_node: tuple[str, Any],
) -> None:
    node, kubelet = doomed_node
    kuberay.node = node  # the attempt's pods are bound to the doomed node
    running_with_checkpoint(cluster, kuberay, step=10)
    (head,) = cluster.pods("trainingrun.dev/attempt=1")
    assert head.spec.node_name == node

    kubelet.stop()  # the node stops heartbeating; the node lifecycle controller marks it Unknown after its grace
    ended = eventually(
        lambda: (lambda a: a if a and a[0].get("end") else None)(cluster.status("tiny").get("attempts")),
        timeout=120,
        what="attempt 1 ended after its node stopped heartbeating",
    )
    assert ended[0]["reason"] == "Preempted", ended[0]
    assert f"node {node}" in ended[0]["message"] and "not Ready" in ended[0]["message"], ended[0]
    status = cluster.status("tiny")
    assert status["restarts"]["preempted"] == 1
    assert status["restarts"]["applicationFailure"] == 0 and status["restarts"]["infrastructureFailure"] == 0
    assert status.get("consecutiveFailures", 0) == 0
    eventually(lambda: cluster.rayjob("tiny-a1") is None, what="attempt 1's RayJob deleted")

    # Nobody confirms the pods' end on a dead node: they stay, Terminating, and attempt 2 must not start.
    assert all(
        p.metadata.deletion_timestamp
        for p in eventually(
            lambda: (lambda ps: ps if ps and all(p.metadata.deletion_timestamp for p in ps) else None)(
                cluster.pods("trainingrun.dev/attempt=1")
            ),
            what="attempt 1's pods Terminating (the garbage collector followed the RayJob's deletion)",
        )
    )
    assert stays_absent(cluster, "tiny-a2", seconds=4), "attempt 2 was created while attempt 1's pods remained"
    assert cluster.status("tiny")["phase"] == "Restarting"

    # The node is declared shut down; the pod garbage collector then force-deletes its terminating pods.
    control_plane.kubectl("taint", "node", node, f"{OUT_OF_SERVICE['key']}={OUT_OF_SERVICE['value']}:NoExecute")
    job2 = eventually(lambda: cluster.rayjob("tiny-a2"), timeout=90, what="RayJob tiny-a2 once the old pods are gone")
    assert not cluster.pods("trainingrun.dev/attempt=1"), "attempt 2 was created before attempt 1's pods were gone"
    assert args_of(job2)["--resume"] == "10"
    status = cluster.status("tiny")
    assert status["attempt"]["number"] == 2 and status["attempt"]["resumedFrom"] == 10
    cluster.events_with("tiny", "Preempted", "Restarting", "DeletedRayJob", "AttemptStarted")


def test_a_rayjob_suspended_by_a_queue_is_preempted_and_attempt_two_resumes_from_the_recorded_step(
    cluster: Cluster, kuberay: KubeRayDouble, operator: InProcessOperator
) -> None:
    running_with_checkpoint(cluster, kuberay, step=10)

    # What Kueue does to a workload it preempts: spec.suspend on the job (then KubeRay tears the cluster down).
    cluster.custom.patch_namespaced_custom_object(
        "ray.io",
        "v1",
        cluster.namespace,
        "rayjobs",
        "tiny-a1",
        {"spec": {"suspend": True}},
        _content_type="application/merge-patch+json",
    )
    job2 = eventually(lambda: cluster.rayjob("tiny-a2"), what="RayJob tiny-a2 after the queue suspended attempt 1")
    assert args_of(job2)["--resume"] == "10"
    assert cluster.rayjob("tiny-a1") is None, "the suspended attempt's RayJob is deleted"
    assert not cluster.pods("trainingrun.dev/attempt=1"), "attempt 2 was created before attempt 1's pods were gone"
    status = cluster.status("tiny")
    first = status["attempts"][0]
    assert first["reason"] == "Preempted" and "suspended by a queue" in first["message"], first
    assert status["restarts"]["preempted"] == 1 and status["restarts"]["applicationFailure"] == 0
    assert status["attempt"]["resumedFrom"] == 10
    assert status["checkpoints"]["latest"]["step"] == 10
    cluster.events_with("tiny", "Preempted", "Restarting", "DeletedRayJob")

    kuberay.start("tiny-a2")
    eventually(lambda: phase_is(cluster, "tiny", "Running"), what="attempt 2 Running")


def test_a_suspended_run_keeps_its_checkpoints_and_budgets_and_resumes_from_the_recorded_step_when_unsuspended(
    cluster: Cluster, kuberay: KubeRayDouble, operator: InProcessOperator
) -> None:
    running_with_checkpoint(cluster, kuberay, step=10)

    cluster.custom.patch_namespaced_custom_object(
        "trainingrun.dev",
        "v1alpha1",
        cluster.namespace,
        "trainingruns",
        "tiny",
        {"spec": {"suspend": True}},
        _content_type="application/merge-patch+json",
    )
    status = eventually(lambda: phase_is(cluster, "tiny", "Suspended"), what="phase Suspended")
    suspended = condition(status, "Suspended")
    assert (
        suspended["status"] == "True"
        and suspended["observedGeneration"] == cluster.run("tiny")["metadata"]["generation"]
    )
    assert condition(status, "Running")["status"] == "False"
    eventually(lambda: cluster.rayjob("tiny-a1") is None, what="attempt 1's RayJob deleted")
    eventually(lambda: not cluster.pods("trainingrun.dev/attempt=1"), what="attempt 1's pods gone")
    assert stays_absent(cluster, "tiny-a2", seconds=3), "a suspended run started an attempt"
    status = cluster.status("tiny")
    assert status["phase"] == "Suspended"
    assert status["checkpoints"]["latest"]["step"] == 10, "checkpoints are kept while suspended"
    assert condition(status, "CheckpointAvailable")["status"] == "True"
    assert status["restarts"]["total"] == 0, status["restarts"]
    assert status.get("consecutiveFailures", 0) == 0
    assert status["attempts"][0]["reason"] == "Suspended"
    cluster.events_with("tiny", "Suspended", "DeletedRayJob")

    cluster.custom.patch_namespaced_custom_object(
        "trainingrun.dev",
        "v1alpha1",
        cluster.namespace,
        "trainingruns",
        "tiny",
        {"spec": {"suspend": False}},
        _content_type="application/merge-patch+json",
    )
    job2 = eventually(lambda: cluster.rayjob("tiny-a2"), what="RayJob tiny-a2 after unsuspending")
    assert args_of(job2)["--resume"] == "10"
    status = cluster.status("tiny")
    assert status["attempt"]["resumedFrom"] == 10
    assert condition(status, "Suspended")["status"] == "False"

    kuberay.start("tiny-a2")
    cluster.report("tiny", attempt=2, step=40)
    eventually(lambda: checkpoint_recorded(cluster, "tiny", 40), what="attempt 2's checkpoint recorded")
    kuberay.succeed("tiny-a2")
    status = eventually(lambda: phase_is(cluster, "tiny", "Succeeded"), what="phase Succeeded")
    assert condition(status, "Succeeded")["status"] == "True"
    assert status["restarts"]["total"] == 0
    assert [a["reason"] for a in status["attempts"]] == ["Suspended", "Succeeded"]


def attempt_ended(cluster: Cluster, run: str) -> dict[str, Any] | None:
    attempts = cluster.status(run).get("attempts")
    return attempts[0] if attempts and attempts[0].get("end") else None


def not_ready(control_plane: Any, node: str) -> dict[str, Any] | None:
    """The node's Ready condition, if it is not True."""
    conditions = control_plane.get(f"/api/v1/nodes/{node}")["status"]["conditions"]
    ready = next((c for c in conditions if c["type"] == "Ready"), None)
    return ready if ready is not None and ready["status"] != "True" else None


class Reporter:
    """Plays the driver's progress reports: a new checkpoint every `period` seconds, `updated` now, until stopped."""

    def __init__(self, cluster: Cluster, run: str, attempt: int, first_step: int, period: float = 1.0) -> None:
        self.cluster, self.run, self.attempt, self.period = cluster, run, attempt, period
        self.step = first_step
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="reporter", daemon=True)

    def _loop(self) -> None:
        while not self.stop.is_set():
            self.step += 1
            self.cluster.report(self.run, attempt=self.attempt, step=self.step, updated=timestamps.now())
            self.stop.wait(self.period)

    def __enter__(self) -> Reporter:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(10)


def test_a_head_whose_node_stops_reporting_keeps_its_attempt_while_the_driver_reports_until_the_grace_ends(
    control_plane: Any,
    cluster: Cluster,
    kuberay: KubeRayDouble,
    operator: InProcessOperator,
    doomed_node: tuple[str, Any],
) -> None:
    node, kubelet = doomed_node
    kuberay.node = node
    grace = 20
    policy = {"failureBudget": 3, "backoff": {"initialSeconds": 0.2, "maxSeconds": 1}, "nodeNotReadySeconds": grace}
    running_with_checkpoint(cluster, kuberay, step=10, restartPolicy=policy)

    with Reporter(cluster, "tiny", attempt=1, first_step=10) as reporter:
        kubelet.stop()  # the node lifecycle controller marks it Unknown about 30 s after its last lease renewal
        ready = eventually(lambda: not_ready(control_plane, node), timeout=90, what=f"node {node} not Ready")
        since = timestamps.parse(ready["lastTransitionTime"])

        # Within the grace: a report made after the node turned NotReady is recorded by a pass (which read the node
        # anew) that keeps the attempt.
        step = reporter.step + 1  # reported after the node was seen NotReady
        eventually(lambda: checkpoint_recorded_at_least(cluster, "tiny", step), what=f"a report past step {step}")
        status = cluster.status("tiny")
        assert datetime.datetime.now(datetime.UTC) < since + datetime.timedelta(seconds=grace), "too slow to tell"
        assert status["phase"] == "Running" and status["attempt"]["number"] == 1, status
        assert "end" not in status["attempt"] and not status.get("attempts"), status

        # Beyond the grace the attempt ends, although the driver still reports.
        ended = eventually(lambda: attempt_ended(cluster, "tiny"), timeout=60, what="attempt 1 ended after the grace")
    assert ended["reason"] == "Preempted", ended
    assert f"node {node}" in ended["message"] and f"nodeNotReadySeconds: {grace}" in ended["message"], ended
    assert timestamps.parse(ended["end"]) >= since + datetime.timedelta(seconds=grace - 1), (ended, since)
    status = cluster.status("tiny")
    assert status["restarts"]["preempted"] == 1 and status["restarts"]["infrastructureFailure"] == 0
    recorded = status["checkpoints"]["latest"]["step"]

    # The next attempt, once the node is declared shut down and its pods are gone, resumes from the recorded step.
    control_plane.kubectl("taint", "node", node, f"{OUT_OF_SERVICE['key']}={OUT_OF_SERVICE['value']}:NoExecute")
    job2 = eventually(lambda: cluster.rayjob("tiny-a2"), timeout=90, what="RayJob tiny-a2 once the old pods are gone")
    assert args_of(job2)["--resume"] == str(recorded)
    assert cluster.status("tiny")["attempt"]["resumedFrom"] == recorded


def checkpoint_recorded_at_least(cluster: Cluster, run: str, step: int) -> dict[str, Any] | None:
    latest = (cluster.status(run).get("checkpoints") or {}).get("latest")
    return latest if latest and latest["step"] >= step else None


def test_a_worker_pod_evicted_mid_attempt_is_counted_once_and_the_attempt_goes_on(
    control_plane: Any, cluster: Cluster, kuberay: KubeRayDouble, operator: InProcessOperator
) -> None:
    ray = tiny_run()["spec"]["ray"]
    ray["workers"] = [{"name": "gen", "replicas": 2}]
    running_with_checkpoint(cluster, kuberay, step=10, ray=ray)
    lost = kuberay.worker("tiny-a1", "gen", 0)
    assert {p.metadata.name for p in cluster.pods("trainingrun.dev/attempt=1")} == {
        kuberay.head("tiny-a1"),
        lost,
        kuberay.worker("tiny-a1", "gen", 1),
    }

    kuberay.evict(lost)
    status = eventually(
        lambda: (lambda s: s if (s.get("attempt") or {}).get("workersLost") == 1 else None)(cluster.status("tiny")),
        what="workersLost: 1",
    )
    assert status["attempt"]["lostWorkerPods"] == [lost]
    (message,) = eventually(
        lambda: [m for r, m in cluster.event_messages("tiny") if r == "WorkerLost"] or None, what="a WorkerLost event"
    )
    assert f"worker pod {lost} lost (DisruptionTarget: EvictionByEvictionAPI)" in message, message

    # Once the pod is gone, a later pass (it records a new checkpoint) still keeps attempt 1 and counts nothing twice.
    eventually(
        lambda: lost not in {p.metadata.name for p in cluster.pods("trainingrun.dev/attempt=1")}, what="pod gone"
    )
    cluster.report("tiny", attempt=1, step=20)
    eventually(lambda: checkpoint_recorded(cluster, "tiny", 20), what="checkpoint step 20 recorded")
    status = cluster.status("tiny")
    assert status["phase"] == "Running" and status["attempt"]["number"] == 1 and "end" not in status["attempt"]
    assert status["attempt"]["workersLost"] == 1 and status["restarts"]["total"] == 0
    assert not status.get("attempts"), status["attempts"]
    job = cluster.rayjob("tiny-a1")
    assert job is not None and not job["metadata"].get("deletionTimestamp"), "the attempt's RayJob stays"
    assert cluster.rayjob("tiny-a2") is None
    assert cluster.events_with("tiny", "WorkerLost").count("WorkerLost") == 1

    wide = control_plane.kubectl("get", "trun", "tiny", "-n", cluster.namespace, "-o", "wide").stdout.splitlines()
    header, row = wide[0].split(), wide[1].split()
    assert row[header.index("WORKERS-LOST")] == "1", wide


def test_a_driver_that_found_no_generation_worker_in_time_is_preempted_and_attempt_two_resumes(
    cluster: Cluster, kuberay: KubeRayDouble, operator: InProcessOperator
) -> None:
    running_with_checkpoint(cluster, kuberay, step=10)
    kuberay.fail("tiny-a1", exit_code=4, log="GenerationLost: no generation worker for 300 s")
    job2 = eventually(lambda: cluster.rayjob("tiny-a2"), what="RayJob tiny-a2 after exit code 4")
    assert args_of(job2)["--resume"] == "10"
    status = cluster.status("tiny")
    first = status["attempts"][0]
    assert first["reason"] == "Preempted" and "workerReplacementSeconds" in first["message"], first
    assert status["restarts"]["preempted"] == 1 and status["restarts"]["applicationFailure"] == 0
    assert status.get("consecutiveFailures", 0) == 0
    cluster.events_with("tiny", "Preempted", "Restarting", "DeletedRayJob", "AttemptStarted")


def test_a_driver_that_stops_reporting_is_stalled_at_its_deadline_and_attempt_two_resumes_from_the_recorded_step(
    cluster: Cluster, kuberay: KubeRayDouble, operator: InProcessOperator
) -> None:
    deadline = 4.0
    policy = {"backoff": {"initialSeconds": 0.2, "maxSeconds": 1, "factor": 2}, "progressDeadlineSeconds": deadline}
    cluster.apply_run(tiny_run(restartPolicy=policy))
    kuberay.start("tiny-a1")
    eventually(lambda: phase_is(cluster, "tiny", "Running"), what="attempt 1 Running")
    cluster.report("tiny", attempt=1, step=10, updated=timestamps.now())  # then silence: no event wakes the run
    reported = time.monotonic()
    eventually(lambda: checkpoint_recorded(cluster, "tiny", 10), what="checkpoint step 10 recorded")
    assert cluster.status("tiny")["phase"] == "Running"

    ended = eventually(
        lambda: (lambda a: a[0] if a and a[0].get("end") else None)(cluster.status("tiny").get("attempts")),
        timeout=60,
        what="attempt 1 ended by the stall watchdog",
    )
    quiet = time.monotonic() - reported
    assert ended["reason"] == "Stalled", ended
    assert (
        "its last report was step 10 at" in ended["message"]
        and f"progressDeadlineSeconds: {deadline:g}" in ended["message"]
    ), ended
    assert deadline - 1 <= quiet < deadline + 10, f"ended {quiet:.1f}s after the last report"
    job2 = eventually(lambda: cluster.rayjob("tiny-a2"), what="RayJob tiny-a2 after the stall")
    assert args_of(job2)["--resume"] == "10"
    assert cluster.rayjob("tiny-a1") is None, "the stalled attempt's RayJob is deleted"
    status = cluster.status("tiny")
    assert status["restarts"]["stalled"] == 1 and status["consecutiveFailures"] == 1
    cluster.events_with("tiny", "Stalled", "Restarting", "DeletedRayJob", "AttemptStarted")
