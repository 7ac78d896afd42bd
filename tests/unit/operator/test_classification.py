"""Failure classification: every observed way an attempt ends maps to the right class (table-driven)."""

from __future__ import annotations

import dataclasses

import pytest

from trainingrun_operator import observation
from trainingrun_operator.classification import FailureClass, classify
from trainingrun_operator.observation import AttemptObservation, PodObservation, RayJobObservation

HEAD = PodObservation(name="h", node_type="head", phase="Running", node_name="n1", node_ready=True)
WORKER = PodObservation(name="w", node_type="worker", phase="Running", node_name="n2", node_ready=True)
RUNNING_JOB = RayJobObservation(name="r-a1", deployment_status="Running", job_status="RUNNING")


def obs(
    job: RayJobObservation | None = RUNNING_JOB, pods: tuple[PodObservation, ...] = (HEAD, WORKER), **kw: object
) -> AttemptObservation:
    return AttemptObservation(number=1, rayjob=job, pods=pods, **kw)  # type: ignore[arg-type]


def failed_job(message: str, reason: str = "AppFailed") -> RayJobObservation:
    return RayJobObservation(
        name="r-a1", deployment_status="Failed", job_status="FAILED", reason=reason, message=message
    )


PRE, APP, INFRA, RESTORE = (
    FailureClass.PREEMPTED,
    FailureClass.APPLICATION_FAILURE,
    FailureClass.INFRASTRUCTURE_FAILURE,
    FailureClass.FAILED_RESTORE,
)

TABLE: list[tuple[str, AttemptObservation, str | None, FailureClass | None, bool]] = [
    # (case, observation, restore_error, expected class, permanent)
    (
        "head has DisruptionTarget",
        obs(pods=(dataclasses.replace(HEAD, disruption="PreemptionByScheduler"),)),
        None,
        PRE,
        False,
    ),
    (
        "worker has DisruptionTarget",
        obs(pods=(HEAD, PodObservation(name="w", node_type="worker", disruption="EvictionByEvictionAPI"))),
        None,
        PRE,
        False,
    ),
    (
        "head evicted (pod reason)",
        obs(pods=(PodObservation(name="h", node_type="head", phase="Failed", reason="Evicted", exit_code=137),)),
        None,
        PRE,
        False,
    ),
    (
        "head on a NotReady node",
        obs(pods=(PodObservation(name="h", node_type="head", phase="Running", node_name="n1", node_ready=False),)),
        None,
        PRE,
        False,
    ),
    (
        "head's node is gone",
        obs(pods=(PodObservation(name="h", node_type="head", phase="Running", node_name="n1", node_gone=True),)),
        None,
        PRE,
        False,
    ),
    (
        "RayJob suspended by a queue",
        obs(job=RayJobObservation(name="r-a1", deployment_status="Suspending", suspend=True)),
        None,
        PRE,
        False,
    ),
    (
        "preemption explains a failed job",
        obs(
            job=failed_job("exit code 1"),
            pods=(PodObservation(name="h", node_type="head", disruption="DeletionByTaintManager"),),
        ),
        None,
        PRE,
        False,
    ),
    (
        "driver exited 1",
        obs(job=failed_job("Job entrypoint command failed with exit code 1, last available logs")),
        None,
        APP,
        False,
    ),
    ("job FAILED without an exit code", obs(job=failed_job("the job failed")), None, APP, False),
    ("driver exited 2 (bad config)", obs(job=failed_job("failed with exit code 2")), None, APP, True),
    (
        "driver exited 3 (restore)",
        obs(job=failed_job("failed with exit code 3, logs: RestoreFailed: digest mismatch")),
        None,
        RESTORE,
        False,
    ),
    ("driver reported restoreError", obs(), "manifest checksum mismatch in policy/weights.pt", RESTORE, False),
    ("submission failed", obs(job=failed_job("dashboard unreachable", reason="SubmissionFailed")), None, INFRA, False),
    (
        "RayJob failed validation",
        obs(job=RayJobObservation(name="r-a1", deployment_status="ValidationFailed", reason="ValidationFailed")),
        None,
        INFRA,
        True,
    ),
    (
        "grace period exceeded",
        obs(
            job=RayJobObservation(
                name="r-a1",
                deployment_status="Failed",
                job_status="RUNNING",
                reason="JobDeploymentStatusTransitionGracePeriodExceeded",
            )
        ),
        None,
        INFRA,
        False,
    ),
    (
        "image cannot be pulled",
        obs(
            job=RayJobObservation(name="r-a1", deployment_status="Initializing"),
            pods=(PodObservation(name="h", node_type="head", waiting_reason="ImagePullBackOff"),),
        ),
        None,
        INFRA,
        False,
    ),
    ("head gone while RayJob Running", obs(pods=(WORKER,)), None, INFRA, False),
    (
        "head being deleted",
        obs(pods=(PodObservation(name="h", node_type="head", phase="Running", deleting=True),)),
        None,
        INFRA,
        False,
    ),
    (
        "head OOMKilled",
        obs(
            pods=(
                PodObservation(
                    name="h", node_type="head", phase="Failed", exit_code=137, termination_reason="OOMKilled"
                ),
            )
        ),
        None,
        INFRA,
        False,
    ),
    ("RayJob deleted while running", obs(job=None, pods=(HEAD,)), None, INFRA, False),
    ("local driver exited 1", AttemptObservation(number=1, backend="local", exit_code=1), None, APP, False),
    (
        "local driver exited 3",
        AttemptObservation(number=1, backend="local", exit_code=3, stderr_tail="RestoreFailed: x"),
        None,
        RESTORE,
        False,
    ),
    (
        "local driver killed by chaos",
        AttemptObservation(
            number=1,
            backend="local",
            exit_code=-9,
            pods=(PodObservation(name="pid-1", node_type="head", phase="Failed", disruption="ChaosKill"),),
        ),
        None,
        PRE,
        False,
    ),
]


@pytest.mark.parametrize(
    ("case", "observed", "restore_error", "expected", "permanent"), TABLE, ids=[t[0] for t in TABLE]
)
def test_observation_maps_to_its_failure_class(
    case: str, observed: AttemptObservation, restore_error: str | None, expected: FailureClass, permanent: bool
) -> None:
    outcome = classify(observed, running=True, restore_error=restore_error)
    assert outcome is not None, case
    assert outcome.failure is expected
    assert outcome.permanent is permanent
    assert outcome.detail


@pytest.mark.parametrize(
    "observed",
    [
        obs(job=RayJobObservation(name="r-a1", job_status="SUCCEEDED", deployment_status="Complete"), pods=()),
        AttemptObservation(number=1, backend="local", exit_code=0),
    ],
    ids=["KubeRay SUCCEEDED", "local exit 0"],
)
def test_a_finished_driver_is_success(observed: AttemptObservation) -> None:
    outcome = classify(observed, running=True, restore_error=None)
    assert outcome is not None and outcome.succeeded


@pytest.mark.parametrize(
    ("observed", "running"),
    [
        (obs(), True),
        (obs(job=RayJobObservation(name="r-a1", deployment_status="Initializing"), pods=()), False),
        (obs(job=None, pods=()), False),
        (obs(job=RayJobObservation(name="r-a1", deployment_status="Suspended", suspend=True), pods=()), False),
        (AttemptObservation(number=1, backend="local", pods=(HEAD,)), True),
    ],
    ids=["running", "initializing", "not created yet", "queued by Kueue before running", "local process alive"],
)
def test_an_attempt_still_going_has_no_outcome(observed: AttemptObservation, running: bool) -> None:
    assert classify(observed, running=running, restore_error=None) is None


def test_pod_observation_reads_disruption_node_and_container_state_from_a_raw_pod() -> None:
    pod = {
        "metadata": {"name": "h", "labels": {"ray.io/node-type": "head"}, "deletionTimestamp": "2025-01-01T00:00:00Z"},
        "spec": {"nodeName": "n1"},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}],
            "containerStatuses": [{"state": {"terminated": {"exitCode": 143, "reason": "Error"}}}],
        },
    }
    nodes = {"n1": {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}}
    seen = observation.pod_observation(pod, nodes)
    assert (seen.is_head, seen.deleting, seen.disruption, seen.node_ready, seen.exit_code) == (
        True,
        True,
        "EvictionByEvictionAPI",
        False,
        143,
    )
    assert observation.pod_observation(pod, {}).node_gone


def test_rayjob_observation_reads_kuberay_status_and_the_exit_code_in_its_message() -> None:
    job = {
        "metadata": {"name": "r-a1"},
        "spec": {"suspend": False},
        "status": {
            "jobDeploymentStatus": "Failed",
            "jobStatus": "FAILED",
            "reason": "AppFailed",
            "message": "Job entrypoint command failed with exit code 3",
        },
    }
    seen = observation.rayjob_observation(job)
    assert (seen.deployment_status, seen.job_status, seen.reason) == ("Failed", "FAILED", "AppFailed")
    assert observation.exit_code_from_message(seen.message) == 3
