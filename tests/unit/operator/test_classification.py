"""Failure classification: every observed way an attempt ends maps to the right class, lost worker pods are
found and never end the attempt, and a head on a NotReady node ends it only after its grace (table-driven, with
an injected clock)."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import pytest

from trainingrun_operator.core import observation, watchdog
from trainingrun_operator.core.classification import (
    Context,
    FailureClass,
    LostWorker,
    classify,
    grace_left,
    lost_workers,
)
from trainingrun_operator.core.observation import AttemptObservation, PodObservation, RayJobObservation

T0 = datetime.datetime(2025, 1, 1, 12, tzinfo=datetime.UTC)
GRACE = 60.0


def ctx(**kw: Any) -> Context:
    """The context of a running attempt at T0 with the default grace, fields replaced by `kw`."""
    return Context(**{"now": T0, "node_not_ready_seconds": GRACE, "running": True, **kw})


def ago(seconds: float) -> datetime.datetime:
    return T0 - datetime.timedelta(seconds=seconds)


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


PRE, APP, INFRA, RESTORE, STALLED = (
    FailureClass.PREEMPTED,
    FailureClass.APPLICATION_FAILURE,
    FailureClass.INFRASTRUCTURE_FAILURE,
    FailureClass.FAILED_RESTORE,
    FailureClass.STALLED,
)
LR_CHANGED = (
    "spec.trainer.grpo.lr: 0.003 -> 0.01 (changed since step_20 was trained; config hash 1a2b3c4d5e6f, this config "
    "6f5e4d3c2b1a). A checkpoint resumes only under the math that wrote it: to resume from this run's checkpoints, "
    "set it back and start the run again; to train with the new value, start a TrainingRun of another name"
)
"""What the driver says after `ConfigMismatch: ` when spec.trainer.grpo.lr changed since the checkpoint."""
SILENT = watchdog.Watch(progress_seconds=60, startup_seconds=300, running_since=ago(600), step=12, reported=ago(61))
"""A Running attempt whose driver last reported step 12 61 s ago, past its 60 s deadline."""
NEVER_REPORTED = watchdog.Watch(progress_seconds=60, startup_seconds=300, running_since=ago(300))
"""A Running attempt whose driver has not reported in the 300 s of its start-up bound."""

TABLE: list[tuple[str, AttemptObservation, Context, FailureClass | None, bool]] = [
    # (case, observation, context, expected class, permanent)
    (
        "head has DisruptionTarget",
        obs(pods=(dataclasses.replace(HEAD, disruption="PreemptionByScheduler"),)),
        ctx(),
        PRE,
        False,
    ),
    (
        "head evicted (pod reason)",
        obs(pods=(PodObservation(name="h", node_type="head", phase="Failed", reason="Evicted", exit_code=137),)),
        ctx(),
        PRE,
        False,
    ),
    (
        "head on a node NotReady beyond the grace",
        obs(pods=(dataclasses.replace(HEAD, node_ready=False, node_ready_changed=ago(GRACE)),)),
        ctx(last_report=T0),
        PRE,
        False,
    ),
    (
        "head on a NotReady node, being deleted",
        obs(pods=(dataclasses.replace(HEAD, node_ready=False, node_ready_changed=ago(1), deleting=True),)),
        ctx(last_report=T0),
        PRE,
        False,
    ),
    (
        "head on a NotReady node, the driver silent beyond the grace",
        obs(pods=(dataclasses.replace(HEAD, node_ready=False, node_ready_changed=ago(1)),)),
        ctx(last_report=ago(GRACE + 1)),
        PRE,
        False,
    ),
    (
        "head on a NotReady node that does not say since when",
        obs(pods=(dataclasses.replace(HEAD, node_ready=False),)),
        ctx(last_report=T0),
        PRE,
        False,
    ),
    (
        "head's node is gone",
        obs(pods=(PodObservation(name="h", node_type="head", phase="Running", node_name="n1", node_gone=True),)),
        ctx(),
        PRE,
        False,
    ),
    (
        "RayJob suspended by a queue",
        obs(job=RayJobObservation(name="r-a1", deployment_status="Suspending", suspend=True)),
        ctx(),
        PRE,
        False,
    ),
    (
        "preemption explains a failed job",
        obs(
            job=failed_job("exit code 1"),
            pods=(PodObservation(name="h", node_type="head", disruption="DeletionByTaintManager"),),
        ),
        ctx(),
        PRE,
        False,
    ),
    (
        "driver exited 1",
        obs(job=failed_job("Job entrypoint command failed with exit code 1, last available logs")),
        ctx(),
        APP,
        False,
    ),
    ("job FAILED without an exit code", obs(job=failed_job("the job failed")), ctx(), APP, False),
    (
        "driver exited 4 (no generation worker came back)",
        obs(job=failed_job("failed with exit code 4, last available logs: GenerationLost: none for 300 s")),
        ctx(),
        PRE,
        False,
    ),
    ("GenerationLost without an exit code", obs(job=failed_job("GenerationLost: none for 300 s")), ctx(), PRE, False),
    (
        "driver exited 8 (a trainer rank's pod left the cluster)",
        obs(job=failed_job("failed with exit code 8, last available logs: TrainerLost: a trainer rank was lost")),
        ctx(),
        PRE,
        False,
    ),
    (
        "TrainerLost without an exit code",
        obs(job=failed_job("TrainerLost: a trainer rank was lost")),
        ctx(),
        PRE,
        False,
    ),
    (
        "driver exited 1 after a worker loss",
        obs(job=failed_job("Job entrypoint command failed with exit code 1")),
        ctx(workers_lost=("w-0",)),
        PRE,
        False,
    ),
    (
        "job FAILED without an exit code after a worker loss",
        obs(job=failed_job("the job failed")),
        ctx(workers_lost=("w-0", "w-1")),
        PRE,
        False,
    ),
    (
        "driver exited 2 after a worker loss (still bad config)",
        obs(job=failed_job("failed with exit code 2")),
        ctx(workers_lost=("w-0",)),
        APP,
        True,
    ),
    (
        "driver exited 3 after a worker loss (still a bad checkpoint)",
        obs(job=failed_job("failed with exit code 3, logs: RestoreFailed: digest mismatch")),
        ctx(workers_lost=("w-0",)),
        RESTORE,
        False,
    ),
    ("driver exited 2 (bad config)", obs(job=failed_job("failed with exit code 2")), ctx(), APP, True),
    (
        "driver exited 3 (restore)",
        obs(job=failed_job("failed with exit code 3, logs: RestoreFailed: digest mismatch")),
        ctx(),
        RESTORE,
        False,
    ),
    (
        "driver reported restoreError",
        obs(),
        ctx(restore_error="manifest checksum mismatch in policy/weights.pt"),
        RESTORE,
        False,
    ),
    (
        "driver reported a verification failure",
        obs(),
        ctx(restore_error="CheckpointCorrupt: step_20/policy/model.pt: checksum mismatch"),
        RESTORE,
        False,
    ),
    ("driver reported a config mismatch", obs(), ctx(restore_error=f"ConfigMismatch: {LR_CHANGED}"), APP, True),
    (
        "driver reported an interrupted restore",
        obs(),
        ctx(restore_error="RestoreInterrupted: OSError: [Errno 5] Input/output error"),
        INFRA,
        False,
    ),
    (
        "driver exited 6 (config mismatch)",
        obs(job=failed_job(f"failed with exit code 6, last available logs: ConfigMismatch: {LR_CHANGED}")),
        ctx(),
        APP,
        True,
    ),
    ("ConfigMismatch without an exit code", obs(job=failed_job(f"ConfigMismatch: {LR_CHANGED}")), ctx(), APP, True),
    (
        "an older driver's config mismatch (exit 3)",
        obs(job=failed_job(f"failed with exit code 3, logs: RestoreFailed: ConfigMismatch: {LR_CHANGED}")),
        ctx(),
        APP,
        True,
    ),
    (
        "driver exited 6 after a worker loss (still the spec)",
        obs(job=failed_job("failed with exit code 6")),
        ctx(workers_lost=("w-0",)),
        APP,
        True,
    ),
    (
        "driver exited 7 (restore interrupted)",
        obs(job=failed_job("failed with exit code 7, last available logs: RestoreInterrupted: OSError: EIO")),
        ctx(),
        INFRA,
        False,
    ),
    ("RestoreInterrupted without an exit code", obs(job=failed_job("RestoreInterrupted: x")), ctx(), INFRA, False),
    (
        "driver exited 7 after a worker loss (still infrastructure)",
        obs(job=failed_job("failed with exit code 7")),
        ctx(workers_lost=("w-0",)),
        INFRA,
        False,
    ),
    ("submission failed", obs(job=failed_job("dashboard unreachable", reason="SubmissionFailed")), ctx(), INFRA, False),
    (
        "RayJob failed validation",
        obs(job=RayJobObservation(name="r-a1", deployment_status="ValidationFailed", reason="ValidationFailed")),
        ctx(),
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
        ctx(),
        INFRA,
        False,
    ),
    (
        "image cannot be pulled",
        obs(
            job=RayJobObservation(name="r-a1", deployment_status="Initializing"),
            pods=(PodObservation(name="h", node_type="head", waiting_reason="ImagePullBackOff"),),
        ),
        ctx(),
        INFRA,
        False,
    ),
    ("head gone while RayJob Running", obs(pods=(WORKER,)), ctx(), INFRA, False),
    (
        "head being deleted",
        obs(pods=(PodObservation(name="h", node_type="head", phase="Running", deleting=True),)),
        ctx(),
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
        ctx(),
        INFRA,
        False,
    ),
    ("RayJob deleted while running", obs(job=None, pods=(HEAD,)), ctx(), INFRA, False),
    ("local driver exited 1", AttemptObservation(number=1, backend="local", exit_code=1), ctx(), APP, False),
    (
        "local driver exited 3",
        AttemptObservation(number=1, backend="local", exit_code=3, stderr_tail="RestoreFailed: x"),
        ctx(),
        RESTORE,
        False,
    ),
    (
        "local driver exited 6",
        AttemptObservation(number=1, backend="local", exit_code=6, stderr_tail=f"ConfigMismatch: {LR_CHANGED}"),
        ctx(),
        APP,
        True,
    ),
    (
        "local driver exited 7",
        AttemptObservation(number=1, backend="local", exit_code=7, stderr_tail="RestoreInterrupted: OSError: EIO"),
        ctx(),
        INFRA,
        False,
    ),
    (
        "local driver exited 4",
        AttemptObservation(number=1, backend="local", exit_code=4, stderr_tail="GenerationLost: none for 300 s"),
        ctx(),
        PRE,
        False,
    ),
    (
        "local driver exited 1 after a worker loss",
        AttemptObservation(number=1, backend="local", exit_code=1),
        ctx(workers_lost=("w-0",)),
        PRE,
        False,
    ),
    ("the driver silent past the progress deadline", obs(), ctx(watch=SILENT), STALLED, False),
    ("no first report within the start-up bound", obs(), ctx(watch=NEVER_REPORTED), STALLED, False),
    (
        "a silent local driver",
        AttemptObservation(number=1, backend="local", pods=(HEAD,)),
        ctx(watch=SILENT),
        STALLED,
        False,
    ),
    (
        "a silent driver after a worker loss is still stalled",
        obs(),
        ctx(watch=SILENT, workers_lost=("w",)),
        STALLED,
        False,
    ),
    ("an exit code explains the silence", obs(job=failed_job("exit code 1")), ctx(watch=SILENT), APP, False),
    (
        "a preempted head explains the silence",
        obs(pods=(dataclasses.replace(HEAD, disruption="PreemptionByScheduler"),)),
        ctx(watch=SILENT),
        PRE,
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
        ctx(),
        PRE,
        False,
    ),
]


@pytest.mark.parametrize(("case", "observed", "context", "expected", "permanent"), TABLE, ids=[t[0] for t in TABLE])
def test_observation_maps_to_its_failure_class(
    case: str, observed: AttemptObservation, context: Context, expected: FailureClass, permanent: bool
) -> None:
    outcome = classify(observed, context)
    assert outcome is not None, case
    assert outcome.failure is expected
    assert outcome.permanent is permanent
    assert outcome.detail


@pytest.mark.parametrize(
    ("observed", "context"),
    [
        (obs(), ctx(restore_error=f"ConfigMismatch: {LR_CHANGED}")),
        (
            obs(job=failed_job(f"exit code 6, last available logs:\nINFO started\nConfigMismatch: {LR_CHANGED}\n")),
            ctx(),
        ),
        (
            AttemptObservation(number=1, backend="local", exit_code=6, stderr_tail=f"ConfigMismatch: {LR_CHANGED}"),
            ctx(),
        ),
    ],
    ids=["restoreError", "KubeRay's message", "local stderr"],
)
def test_a_config_mismatch_is_an_invalid_spec_whose_detail_is_the_drivers_fields_and_fix(
    observed: AttemptObservation, context: Context
) -> None:
    outcome = classify(observed, context)
    assert outcome is not None and outcome.invalid_spec and outcome.permanent
    assert outcome.detail == LR_CHANGED


def test_a_config_mismatch_without_the_drivers_line_still_names_spec_trainer_and_the_fix() -> None:
    outcome = classify(obs(job=failed_job("Job entrypoint command failed with exit code 6")), ctx())
    assert outcome is not None and outcome.invalid_spec
    assert outcome.detail.startswith("spec.trainer: ") and "set it back" in outcome.detail


@pytest.mark.parametrize(
    ("observed", "context"),
    [
        (obs(), ctx(restore_error="CheckpointCorrupt: step_20/manifest.json: not valid JSON")),
        (obs(), ctx(restore_error="RestoreInterrupted: OSError: EIO")),
        (obs(job=failed_job("failed with exit code 3, logs: RestoreFailed: DigestError: mismatch")), ctx()),
        (obs(job=failed_job("failed with exit code 7, logs: RestoreInterrupted: TimeoutError")), ctx()),
    ],
    ids=["verification reported", "interrupted reported", "exit 3", "exit 7"],
)
def test_only_a_config_mismatch_is_an_invalid_spec(observed: AttemptObservation, context: Context) -> None:
    outcome = classify(observed, context)
    assert outcome is not None and not outcome.invalid_spec


def test_an_interrupted_restore_says_what_interrupted_it_and_that_the_step_is_retried() -> None:
    line = "OSError: [Errno 5] Input/output error: '/ckpt/tiny/step_20/policy/model.pt'"
    outcome = classify(obs(job=failed_job(f"exit code 7, last available logs:\nRestoreInterrupted: {line}\n")), ctx())
    assert outcome is not None and line in outcome.detail and "resumes from the same step" in outcome.detail


@pytest.mark.parametrize(
    "observed",
    [
        obs(job=RayJobObservation(name="r-a1", job_status="SUCCEEDED", deployment_status="Complete"), pods=()),
        AttemptObservation(number=1, backend="local", exit_code=0),
    ],
    ids=["KubeRay SUCCEEDED", "local exit 0"],
)
def test_a_finished_driver_is_success(observed: AttemptObservation) -> None:
    outcome = classify(observed, ctx(workers_lost=("w-0",)))
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
    assert classify(observed, ctx(running=running)) is None


def test_a_driver_within_its_deadlines_is_still_going() -> None:
    reporting = dataclasses.replace(SILENT, reported=ago(59))
    starting = dataclasses.replace(NEVER_REPORTED, running_since=ago(299))
    assert classify(obs(), ctx(watch=reporting)) is None
    assert classify(obs(), ctx(watch=starting)) is None


def test_only_a_running_attempt_can_stall() -> None:
    initializing = obs(job=RayJobObservation(name="r-a1", deployment_status="Initializing"))
    assert classify(initializing, ctx(running=False, watch=SILENT)) is None


def test_a_head_on_a_not_ready_node_is_left_to_its_grace_not_to_the_watchdog() -> None:
    observed = obs(pods=(dataclasses.replace(HEAD, node_ready=False, node_ready_changed=ago(10)),))
    assert classify(observed, ctx(watch=SILENT, last_report=ago(30))) is None
    outcome = classify(observed, ctx(watch=SILENT, last_report=ago(61)))
    assert outcome is not None and outcome.failure is PRE, "the node's grace decides, as a preemption"


def test_the_details_name_the_cause_the_lost_worker_and_the_bound() -> None:
    def detail(observed: AttemptObservation, context: Context) -> str:
        outcome = classify(observed, context)
        assert outcome is not None
        return outcome.detail

    after_loss = detail(obs(job=failed_job("failed with exit code 1")), ctx(workers_lost=("w-0", "w-1")))
    assert (
        after_loss
        == "the driver exited with code 1, after worker pod w-1 was lost (2 worker pods lost in this attempt)"
    )
    assert "workerReplacementSeconds" in detail(obs(job=failed_job("failed with exit code 4")), ctx())
    late = obs(pods=(dataclasses.replace(HEAD, node_ready=False, node_ready_changed=ago(75)),))
    assert detail(late, ctx(last_report=T0)) == (
        "node n1 of the head pod h is not Ready (its Ready condition is False or Unknown) for 75s "
        "(spec.restartPolicy.nodeNotReadySeconds: 60)"
    )


# --------------------------------------------------------------------------------- a head's NotReady node

NOT_READY_TABLE: list[tuple[str, float, float | None, bool, float | None]] = [
    # (case, seconds the node has not been Ready, seconds since the driver's last report (None: none yet),
    #  the attempt ends, seconds until it would end)
    ("just turned NotReady, the driver reporting", 1, 0.5, False, 59),
    ("NotReady a while, the driver reporting", 45, 0.5, False, 15),
    ("NotReady, no report yet in this attempt", 45, None, False, 15),
    ("NotReady, the driver quiet for a while", 10, 40, False, 20),
    ("NotReady for exactly the grace", 60, 0.5, True, None),
    ("NotReady beyond the grace although the driver reports", 61, 0.5, True, None),
    ("the driver quiet beyond the grace", 10, 61, True, None),
]


@pytest.mark.parametrize(
    ("case", "down", "quiet", "ends", "left"), NOT_READY_TABLE, ids=[t[0] for t in NOT_READY_TABLE]
)
def test_a_head_on_a_not_ready_node_ends_the_attempt_only_after_its_grace(
    case: str, down: float, quiet: float | None, ends: bool, left: float | None
) -> None:
    observed = obs(pods=(dataclasses.replace(HEAD, node_ready=False, node_ready_changed=ago(down)), WORKER))
    context = ctx(last_report=ago(quiet) if quiet is not None else None)
    outcome = classify(observed, context)
    assert (outcome is not None) is ends, case
    if ends:
        assert outcome is not None and outcome.failure is FailureClass.PREEMPTED
        assert "node n1 of the head pod h is not Ready" in outcome.detail
    assert grace_left(observed, context) == (pytest.approx(left) if left is not None else None)


def test_the_grace_is_the_runs_own_setting() -> None:
    observed = obs(pods=(dataclasses.replace(HEAD, node_ready=False, node_ready_changed=ago(10)),))
    assert classify(observed, ctx(last_report=T0, node_not_ready_seconds=5)) is not None
    assert classify(observed, ctx(last_report=T0, node_not_ready_seconds=0)) is not None
    assert classify(observed, ctx(last_report=T0, node_not_ready_seconds=300)) is None


def test_a_driver_verdict_beats_a_not_ready_head_node() -> None:
    head = dataclasses.replace(HEAD, node_ready=False, node_ready_changed=ago(1), deleting=True)
    done = RayJobObservation(name="r-a1", job_status="SUCCEEDED", deployment_status="Complete")
    outcome = classify(obs(job=done, pods=(head,)), ctx(last_report=T0))
    assert outcome is not None and outcome.succeeded, "KubeRay's teardown after success deletes the head"
    assert grace_left(obs(job=done, pods=(head,)), ctx()) is None


def test_a_ready_head_has_no_grace_to_wait_for() -> None:
    assert grace_left(obs(), ctx()) is None
    assert grace_left(obs(pods=(WORKER,)), ctx()) is None


# --------------------------------------------------------------------------------------- lost workers

LOST_TABLE: list[tuple[str, PodObservation, str]] = [
    # (case, the worker pod as observed, its cause; "" = not lost)
    ("DisruptionTarget", dataclasses.replace(WORKER, disruption="EvictionByEvictionAPI"), "DisruptionTarget: "),
    ("evicted", dataclasses.replace(WORKER, phase="Failed", reason="Evicted"), "Evicted"),
    ("preempted by the kubelet", dataclasses.replace(WORKER, reason="Preempting"), "Preempting"),
    ("deleted", dataclasses.replace(WORKER, deleting=True), "deleted"),
    ("its node gone", dataclasses.replace(WORKER, node_gone=True, node_ready=None), "its node n2 is gone"),
    ("its node NotReady", dataclasses.replace(WORKER, node_ready=False, node_ready_changed=ago(600)), ""),
    ("crashed on its own", dataclasses.replace(WORKER, phase="Failed", exit_code=1), ""),
    ("healthy", WORKER, ""),
]


@pytest.mark.parametrize(("case", "worker", "cause"), LOST_TABLE, ids=[t[0] for t in LOST_TABLE])
def test_a_lost_worker_pod_is_found_with_its_cause_and_never_ends_the_attempt(
    case: str, worker: PodObservation, cause: str
) -> None:
    observed = obs(pods=(HEAD, worker))
    found = lost_workers(observed)
    if cause:
        (lost,) = found
        assert lost.name == "w" and lost.cause.startswith(cause), lost
    else:
        assert found == (), case
    assert classify(observed, ctx(workers_lost=("w",) if cause else ())) is None, "a worker's loss ends nothing"


def test_a_departed_worker_is_lost_once_and_the_present_observation_wins() -> None:
    gone = PodObservation(name="w-gone", node_type="worker", disruption="PreemptionByScheduler")
    going = dataclasses.replace(WORKER, name="w-going", deleting=True)
    remembered = dataclasses.replace(going, disruption="EvictionByEvictionAPI")
    observed = obs(pods=(HEAD, going), departed=(gone, remembered))
    assert lost_workers(observed) == (
        LostWorker("w-going", "deleted"),
        LostWorker("w-gone", "DisruptionTarget: PreemptionByScheduler"),
    )


@pytest.mark.parametrize(
    "observed",
    [
        obs(job=RayJobObservation(name="r-a1", deleting=True)),
        obs(job=RayJobObservation(name="r-a1", deployment_status="Complete", job_status="SUCCEEDED")),
        obs(job=failed_job("failed with exit code 1")),
        obs(pods=()),
        obs(pods=(dataclasses.replace(HEAD, deleting=True),)),
    ],
    ids=["RayJob being deleted", "job succeeded", "job failed", "head gone", "head being deleted"],
)
def test_workers_deleted_while_the_whole_cluster_goes_are_not_lost(observed: AttemptObservation) -> None:
    deleted = dataclasses.replace(WORKER, deleting=True)
    observed = dataclasses.replace(observed, pods=(*observed.pods, deleted))
    assert lost_workers(observed) == ()
    evicted = dataclasses.replace(deleted, disruption="EvictionByEvictionAPI")
    assert lost_workers(dataclasses.replace(observed, pods=(*observed.pods[:-1], evicted))) == (
        LostWorker("w", "DisruptionTarget: EvictionByEvictionAPI"),
    ), "a platform cause is a loss even then"


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
    nodes = {
        "n1": {
            "status": {
                "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": "2025-01-01T11:59:30Z"}]
            }
        }
    }
    seen = observation.pod_observation(pod, nodes)
    assert (seen.is_head, seen.deleting, seen.disruption, seen.node_ready, seen.exit_code) == (
        True,
        True,
        "EvictionByEvictionAPI",
        False,
        143,
    )
    assert seen.node_ready_changed == ago(30)
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


def soon(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


EVICTED_HEAD = dataclasses.replace(HEAD, disruption="EvictionByEvictionAPI", deleting=True, deletion_deadline=soon(20))


def test_an_evicted_head_in_its_grace_period_keeps_the_attempt_going_until_the_grace_ends() -> None:
    observed = obs(pods=(EVICTED_HEAD, WORKER))
    assert classify(observed, ctx()) is None  # the driver may be saving on the notice
    assert grace_left(observed, ctx()) == pytest.approx(25.0)  # 20 s of grace, 5 s for the kill to show


def test_an_evicted_head_past_its_grace_period_is_preempted() -> None:
    observed = obs(pods=(EVICTED_HEAD, WORKER))
    outcome = classify(observed, ctx(now=soon(26)))
    assert outcome is not None and outcome.failure is PRE


@pytest.mark.parametrize(
    "observed",
    [
        obs(job=failed_job("Job entrypoint command failed with exit code 5"), pods=(EVICTED_HEAD,)),
        obs(pods=(dataclasses.replace(EVICTED_HEAD, phase="Failed"),)),
        obs(pods=(dataclasses.replace(EVICTED_HEAD, node_ready=False),)),
    ],
    ids=["the driver stopped", "the container ended", "the node is down"],
)
def test_an_evicted_head_whose_driver_cannot_save_any_more_ends_the_attempt_at_once(
    observed: AttemptObservation,
) -> None:
    outcome = classify(observed, ctx())
    assert outcome is not None and outcome.failure is PRE


def test_a_driver_that_saved_on_the_notice_and_stopped_is_preempted() -> None:
    outcome = classify(obs(job=failed_job("Preempted: saved step 12 on the notice")), ctx())
    assert outcome is not None and outcome.failure is PRE and "notice" in outcome.detail
    outcome = classify(obs(job=failed_job("Job entrypoint command failed with exit code 5")), ctx())
    assert outcome is not None and outcome.failure is PRE


DISRUPTED_HEAD = dataclasses.replace(
    HEAD, disruption="EvictionByEvictionAPI", disruption_since=ago(2), grace_seconds=30
)
"""The API server's first write of an eviction: DisruptionTarget, 2 s ago; the deletion has not shown yet."""


def test_a_head_with_disruption_target_not_yet_deleted_keeps_the_attempt_until_its_grace_from_the_condition_ends() -> (
    None
):
    observed = obs(pods=(DISRUPTED_HEAD, WORKER))
    assert classify(observed, ctx()) is None  # its deletion, and the notice to the driver, are on the way
    assert grace_left(observed, ctx()) == pytest.approx(33.0)  # 28 s of grace left, 5 s for the kill to show
    deleted = dataclasses.replace(DISRUPTED_HEAD, deleting=True, deletion_deadline=soon(20))
    assert grace_left(obs(pods=(deleted, WORKER)), ctx()) == pytest.approx(25.0)  # then the deletion's deadline rules


@pytest.mark.parametrize(
    "head",
    [
        dataclasses.replace(DISRUPTED_HEAD, disruption_since=ago(36)),
        dataclasses.replace(DISRUPTED_HEAD, phase="Failed"),
        dataclasses.replace(DISRUPTED_HEAD, disruption_since=None),
    ],
    ids=["its grace from the condition is over", "its container ended", "the condition says no time"],
)
def test_a_head_with_disruption_target_that_cannot_be_draining_is_preempted_at_once(head: PodObservation) -> None:
    outcome = classify(obs(pods=(head, WORKER)), ctx())
    assert outcome is not None and outcome.failure is PRE and "DisruptionTarget" in outcome.detail


def test_pod_observation_reads_when_disruption_target_came_and_the_pods_grace_period() -> None:
    condition = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
                 "lastTransitionTime": "2025-01-01T11:59:58Z"}  # fmt: skip
    pod = {"metadata": {"name": "h"}, "spec": {"terminationGracePeriodSeconds": 15},
           "status": {"phase": "Running", "conditions": [condition]}}  # fmt: skip
    seen = observation.pod_observation(pod, None)
    assert (seen.disruption, seen.disruption_since, seen.grace_seconds) == ("PreemptionByScheduler", ago(2), 15.0)
    assert observation.pod_observation({"metadata": {"name": "h"}}, None).grace_seconds == 30.0  # the API default


def test_pod_observation_reads_the_end_of_a_deleted_pods_grace_period() -> None:
    pod = {"metadata": {"name": "h", "deletionTimestamp": "2025-01-01T12:00:20Z"}, "status": {"phase": "Running"}}
    assert observation.pod_observation(pod, None).deletion_deadline == soon(20)
