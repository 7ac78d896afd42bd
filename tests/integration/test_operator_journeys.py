"""The operator's journeys against a real API server, with the operator in-process and KubeRay played by a double
(see test_operator_double.py for what the double does and why it stands in for KubeRay here)."""

from __future__ import annotations

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

pytestmark = pytest.mark.cluster


def pods_gone(cluster: Cluster, attempt: int) -> bool:
    return not cluster.pods(f"trainingrun.dev/attempt={attempt}")


def test_an_applied_run_gets_a_rayjob_with_owner_labels_and_driver_entrypoint(
    cluster: Cluster, operator: InProcessOperator
) -> None:
    run = cluster.apply_run(tiny_run())
    job = eventually(lambda: cluster.rayjob("tiny-a1"), what="RayJob tiny-a1")
    (owner,) = job["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "TrainingRun",
        "tiny",
        run["metadata"]["uid"],
        True,
    )
    assert job["metadata"]["labels"]["trainingrun.dev/run"] == "tiny"
    assert job["metadata"]["labels"]["trainingrun.dev/attempt"] == "1"
    assert (job["spec"]["backoffLimit"], job["spec"]["shutdownAfterJobFinishes"]) == (0, True)
    args = args_of(job)
    assert (args["--run"], args["--namespace"], args["--attempt"], args["--resume"]) == (
        "tiny",
        cluster.namespace,
        "1",
        "latest",
    )
    status = cluster.status("tiny")
    assert status["phase"] == "Starting"
    assert status["identity"]["serviceAccountName"] == "tiny-driver"
    assert status["attempt"] == {
        "number": 1,
        "rayJobName": "tiny-a1",
        "start": status["attempt"]["start"],
        "workersLost": 0,
    }


def test_preemption_leads_to_attempt_two_resuming_from_the_recorded_step_with_the_failure_budget_untouched(
    cluster: Cluster, kuberay: KubeRayDouble, operator: InProcessOperator
) -> None:
    cluster.apply_run(tiny_run())
    kuberay.start("tiny-a1")
    eventually(lambda: phase_is(cluster, "tiny", "Running"), what="phase Running")
    cluster.report("tiny", attempt=1, step=10)
    eventually(lambda: (cluster.status("tiny").get("checkpoints") or {}).get("latest"), what="checkpoint recorded")

    kuberay.preempt_head("tiny-a1")
    job2 = eventually(lambda: cluster.rayjob("tiny-a2"), what="RayJob tiny-a2")
    assert args_of(job2)["--resume"] == "10"
    assert cluster.rayjob("tiny-a1") is None, "the preempted attempt's RayJob is deleted"
    assert pods_gone(cluster, 1), "attempt 2 was created only after attempt 1's pods were gone"
    status = cluster.status("tiny")
    assert status["restarts"]["preempted"] == 1 and status["restarts"]["applicationFailure"] == 0
    assert status.get("consecutiveFailures", 0) == 0
    assert status["attempts"][0]["reason"] == "Preempted"
    assert "PreemptionByScheduler" in status["attempts"][0]["message"]
    assert status["attempt"]["resumedFrom"] == 10
    kuberay.start("tiny-a2")
    eventually(lambda: phase_is(cluster, "tiny", "Running"), what="attempt 2 Running")
    cluster.events_with(
        "tiny",
        "AttemptStarted",
        "CreatedRayJob",
        "AttemptRunning",
        "CheckpointRecorded",
        "Preempted",
        "Restarting",
        "DeletedRayJob",
    )


def test_a_head_pod_evicted_while_the_rayjob_says_running_leads_to_attempt_two(
    cluster: Cluster, kuberay: KubeRayDouble, operator: InProcessOperator
) -> None:
    cluster.apply_run(tiny_run())
    kuberay.start("tiny-a1")
    eventually(lambda: phase_is(cluster, "tiny", "Running"), what="phase Running")
    kuberay.evict_head("tiny-a1")
    eventually(lambda: cluster.rayjob("tiny-a2"), what="RayJob tiny-a2 after the head's eviction")
    first = cluster.status("tiny")["attempts"][0]
    assert first["reason"] == "Preempted", first


def test_three_application_failures_fail_the_run(
    cluster: Cluster, kuberay: KubeRayDouble, operator: InProcessOperator
) -> None:
    cluster.apply_run(tiny_run())
    for n in (1, 2, 3):
        kuberay.start(f"tiny-a{n}")
        eventually(lambda: phase_is(cluster, "tiny", "Running"), what=f"attempt {n} Running")
        kuberay.fail(f"tiny-a{n}", exit_code=1)
        if n < 3:
            eventually(lambda n=n: cluster.rayjob(f"tiny-a{n + 1}"), what=f"RayJob tiny-a{n + 1}")
    status = eventually(lambda: phase_is(cluster, "tiny", "Failed"), what="phase Failed")
    assert status["reason"] == "BudgetExhausted"
    assert status["restarts"]["applicationFailure"] == 3
    assert [a["reason"] for a in status["attempts"]] == ["ApplicationFailure"] * 3
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["status"] == "True"
    assert cluster.rayjob("tiny-a4") is None
    eventually(lambda: cluster.rayjob("tiny-a3") is None, what="the last attempt's RayJob deleted")


def test_success_leads_to_succeeded_and_kubectl_wait_sees_it(
    control_plane: Any, cluster: Cluster, kuberay: KubeRayDouble, operator: InProcessOperator
) -> None:
    cluster.apply_run(tiny_run())
    kuberay.start("tiny-a1")
    cluster.report("tiny", attempt=1, step=40)
    kuberay.succeed("tiny-a1")
    waited = control_plane.kubectl(
        "wait", "--for=condition=Succeeded", "trun/tiny", "-n", cluster.namespace, "--timeout=45s", check=False
    )
    assert waited.returncode == 0, waited.stderr
    status = cluster.status("tiny")
    assert status["phase"] == "Succeeded"
    assert status["checkpoints"]["latest"]["step"] == 40
    printed = control_plane.kubectl("get", "trun", "tiny", "-n", cluster.namespace, "--no-headers").stdout.split()
    assert printed[:6] == ["tiny", "Succeeded", "40/120", "40", "1", "0"]


def test_a_checkpoint_report_from_a_stale_attempt_is_ignored(
    cluster: Cluster, kuberay: KubeRayDouble, operator: InProcessOperator
) -> None:
    cluster.apply_run(tiny_run())
    kuberay.start("tiny-a1")
    cluster.report("tiny", attempt=1, step=10)
    eventually(lambda: (cluster.status("tiny").get("checkpoints") or {}).get("latest"), what="checkpoint 10")
    kuberay.preempt_head("tiny-a1")
    eventually(lambda: cluster.rayjob("tiny-a2"), what="RayJob tiny-a2")
    kuberay.start("tiny-a2")
    eventually(lambda: phase_is(cluster, "tiny", "Running"), what="attempt 2 Running")

    cluster.report("tiny", attempt=1, step=20)  # a zombie of attempt 1
    cluster.report("tiny", attempt=2, step=15)  # then the real attempt; the zombie's step 20 must never appear
    latest = eventually(
        lambda: (lambda last: last if last and last["step"] == 15 else None)(
            (cluster.status("tiny").get("checkpoints") or {}).get("latest")
        ),
        what="attempt 2's checkpoint",
    )
    assert latest["attempt"] == 2
    assert [h["step"] for h in cluster.status("tiny")["checkpoints"]["history"]] == [10, 15]


def test_deleting_a_run_removes_its_rayjobs_and_keeps_the_checkpoint_claim(
    control_plane: Any, cluster: Cluster, kuberay: KubeRayDouble, operator: InProcessOperator
) -> None:
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "tiny-checkpoints"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    cluster.core.create_namespaced_persistent_volume_claim(cluster.namespace, pvc)
    cluster.apply_run(tiny_run())
    kuberay.start("tiny-a1")
    assert cluster.run("tiny")["metadata"]["finalizers"] == ["trainingrun.dev/finalizer"]
    control_plane.kubectl("delete", "trun", "tiny", "-n", cluster.namespace, "--wait=true", "--timeout=45s")
    eventually(lambda: not cluster.rayjobs(), what="RayJobs gone")
    assert cluster.core.read_namespaced_persistent_volume_claim("tiny-checkpoints", cluster.namespace)
