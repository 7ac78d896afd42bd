"""Why an attempt ended, and which of its worker pods were lost on the way: the failure classes and the rules
that map observations to them. Pure.

Called by `decision.py` on every reconcile of a Starting or Running attempt. The rules run in a fixed order;
the first that matches decides (a disrupted head explains a failed job, so it is checked before the job's own
verdict):

1. the driver reported a restore error for this attempt, by its prefix (the driver's stderr line, without a
   leading "RestoreFailed: "): "ConfigMismatch:" (the checkpoint's math differs from spec.trainer)
                                                                  -> InvalidSpec (permanent, `invalid_spec`)
   "RestoreInterrupted:" (I/O, Ray, a timeout: not the step's fault) -> InfrastructureFailure
   anything else (the step failed verification)                   -> FailedRestore
   the head pod is being deleted and its grace period has not ended, or it has DisruptionTarget, is not deleted
   yet and its grace period counted from the condition has not ended (the driver may be saving on its preStop
   notice, `trainingrun_runtime.sdk.notice`), its container runs, the driver has no verdict yet
                                                                  -> still going (`grace_left` says until when);
   ending it now would drop the notice checkpoint's report (an ended attempt's reports are not recorded)
2. the head pod has (or, now gone, was last seen with) DisruptionTarget,
   was Evicted or Preempted, or its node is gone                  -> Preempted
   the head's node stopped reporting (Ready False or Unknown) before the driver's verdict, and the head pod is
   being deleted, or the node has not been Ready for nodeNotReadySeconds, or the driver's last progress report
   of this attempt is older than that                             -> Preempted
   (before then the attempt goes on: a kubelet or network blip; `grace_left` says when to look again)
3. the RayJob was suspended by someone else (a Kueue-style queue)
   after the attempt was running, or after Kueue had admitted it  -> Preempted
   (an attempt never admitted is not judged here: it waits in the queue, phase Queued; right after admission
   KubeRay's status may still say Suspended, so an admitted attempt that is not yet running is judged by
   spec.suspend alone)
4. the driver's exit code is known (local mode, or parsed from KubeRay's message), or else the prefix of its last
   line (`contract.Exit`, `contract.Prefix`): OK succeeded,
   CONFIG_MISMATCH -> InvalidSpec (permanent; the message names the fields from the driver's line),
   RESTORE_INTERRUPTED -> InfrastructureFailure, RESTORE_FAILED -> FailedRestore,
   GENERATION_LOST (no generation worker came back within workerReplacementSeconds) -> Preempted,
   TRAINER_LOST (a trainer rank's pod, a worker group of role trainer, left the cluster) -> Preempted,
   PREEMPTED (it saved on the head's notice and stopped) -> Preempted,
   BAD_CONFIG -> ApplicationFailure (permanent), else -> ApplicationFailure
5. KubeRay's verdict: SUCCEEDED -> success; SubmissionFailed, ValidationFailed, STOPPED,
   grace period exceeded -> InfrastructureFailure; AppFailed / FAILED -> ApplicationFailure
6. an image that cannot be pulled, a container config error       -> InfrastructureFailure
7. the head pod is gone, being deleted or terminated while the attempt
   should be running (KubeRay 1.5 leaves the RayJob Running forever) -> InfrastructureFailure
8. the RayJob itself disappeared after the attempt was running     -> InfrastructureFailure
9. the attempt is Running, its head's node is not NotReady, and its driver reported no new step within the
   stall watchdog's deadline (`watchdog.py`; before its first report: the start-up bound) -> Stalled
   (before then the attempt goes on; `Watch.left` says when to look again; a deleted head in its grace period
   is left to rule 1, silent or not: its driver may be saving on the notice)
Then: an ApplicationFailure that is not permanent, in an attempt that lost a worker pod, is Preempted (the lost
worker explains it). Otherwise the attempt is still going (None).

The exit codes, the prefixes and the report are the driver's contract (`trainingrun_runtime.contract`, which both
sides import). Only FailedRestore says that the step the attempt resumed from is bad (the decision marks it); a
config mismatch fails the run as InvalidSpec, whose fix is the spec's; a restore interrupted by I/O, Ray or a
timeout is an InfrastructureFailure, retried from the same step under the failure budget and its backoff (as a
lost head is: the platform's fault, not the program's, and never re-read as a preemption after a worker loss).

Worker pods never end an attempt: generation is all they run, and the driver replaces it. `lost_workers` lists
the worker pods lost to DisruptionTarget, an eviction, a deletion (not the cluster's own teardown) or their node's
removal, for the decision to count. A worker's node that only stops reporting is no loss: the pod may come back.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum

from trainingrun_operator.core import watchdog
from trainingrun_operator.core.observation import (
    EVICTION_REASONS,
    AttemptObservation,
    PodObservation,
    exit_code_from_message,
)
from trainingrun_runtime import contract
from trainingrun_runtime.contract import Exit, Prefix

__all__ = ["Context", "FailureClass", "LostWorker", "Outcome", "classify", "grace_left", "lost_workers"]

DRAIN_SLACK_SECONDS = 5.0
"""After a deleted head's grace period ends: time for the kubelet's kill to show before the attempt is judged."""

_IMAGE_ERRORS = frozenset(
    {"ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError", "CreateContainerError"}
)
_JOB_ENDED = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
_DEPLOYMENT_ENDED = frozenset({"Complete", "Failed", "Suspending", "Suspended"})
_SOUGHT = (Prefix.CONFIG_MISMATCH, Prefix.RESTORE_INTERRUPTED, Prefix.RESTORE_FAILED, Prefix.GENERATION_LOST,
           Prefix.TRAINER_LOST, Prefix.PREEMPTED)  # fmt: skip
"""The prefixes that classify an attempt without an exit code, the first found deciding: a driver of an older
version wrote "RestoreFailed: ConfigMismatch: ..." for a config mismatch."""


class FailureClass(str, enum.Enum):
    """Why an attempt ended badly; each class is charged to one budget (see `restarts.py`)."""

    PREEMPTED = "Preempted"  # the platform took the pods away; charged to the preemption budget
    APPLICATION_FAILURE = "ApplicationFailure"  # the driver exited non-zero on its own; failure budget
    INFRASTRUCTURE_FAILURE = "InfrastructureFailure"  # submission failed, image pull, head lost; failure budget
    FAILED_RESTORE = "FailedRestore"  # the checkpoint to resume from failed verification; failure budget
    STALLED = "Stalled"  # the driver stopped reporting steps (a deadlock, a hung collective); failure budget


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How an attempt ended: success, or a failure class with a human-readable detail."""

    failure: FailureClass | None
    detail: str
    permanent: bool = False  # retrying cannot help (bad config, an invalid RayJob)
    invalid_spec: bool = False  # the spec must change (permanent): the run fails as InvalidSpec, nothing is charged

    @property
    def succeeded(self) -> bool:
        return self.failure is None


SUCCESS = Outcome(failure=None, detail="the driver finished")


@dataclasses.dataclass(frozen=True)
class Context:
    """What the decision knows about the attempt beside the observation: from the status, the spec and the clock."""

    now: datetime.datetime
    node_not_ready_seconds: float  # spec.restartPolicy.nodeNotReadySeconds
    running: bool = False  # the attempt reached Running: a missing head or RayJob was lost, not not-yet-made
    admitted: bool = False  # Kueue admitted the attempt (status.attempt.admitted): a suspend now is a preemption
    restore_error: str | None = None  # status.runtime.restoreError, if that report is this attempt's
    last_report: datetime.datetime | None = None  # status.runtime.updated, if that report is this attempt's
    workers_lost: tuple[str, ...] = ()  # worker pods this attempt lost so far, oldest first (this pass's included)
    watch: watchdog.Watch | None = None  # the stall watchdog of a Running attempt (None: off, or not Running)


@dataclasses.dataclass(frozen=True)
class LostWorker:
    """A worker pod of the attempt that is lost, and why."""

    name: str
    cause: str


def _head_disruption(pod: PodObservation) -> str:
    if pod.disruption:
        return f"the head pod {pod.name} has DisruptionTarget ({pod.disruption})"
    if pod.reason in EVICTION_REASONS:
        return f"the head pod {pod.name} was {pod.reason}"
    if pod.node_gone:
        return f"node {pod.node_name} of the head pod {pod.name} is gone"
    return ""


def _head_not_ready(head: PodObservation, ctx: Context) -> tuple[str, float | None]:
    """For a head on a node that stopped reporting: (why the attempt ends now, else ""; seconds until it would)."""
    where = f"node {head.node_name} of the head pod {head.name} is not Ready (its Ready condition is False or Unknown)"
    grace = ctx.node_not_ready_seconds
    if head.deleting:
        return f"{where} and the pod is being deleted", None
    if head.node_ready_changed is None:
        return f"{where}, since a time the node does not say", None
    down = (ctx.now - head.node_ready_changed).total_seconds()
    if down >= grace:
        return f"{where} for {down:.0f}s (spec.restartPolicy.nodeNotReadySeconds: {grace:g})", None
    left = grace - down
    if ctx.last_report is not None:
        quiet = (ctx.now - ctx.last_report).total_seconds()
        if quiet > grace:
            return (
                f"{where} and the driver has not reported progress for {quiet:.0f}s "
                f"(spec.restartPolicy.nodeNotReadySeconds: {grace:g})",
                None,
            )
        left = min(left, grace - quiet)
    return "", max(0.0, left)


def _not_ready_head(obs: AttemptObservation) -> PodObservation | None:
    """The head, if its node stopped reporting while the driver has no verdict yet (once it has one, that decides)."""
    head, job = obs.head, obs.rayjob
    if head is None or head.node_ready is not False or obs.exit_code is not None:
        return None
    return None if job is not None and job.job_status in _JOB_ENDED else head


def _draining_head(obs: AttemptObservation, ctx: Context) -> float | None:
    """Seconds left (plus slack) while a disrupted head's driver may still save on the notice: a deleted head until
    its grace period ends; a head with DisruptionTarget but no deletion yet until the pod's grace period, counted from
    the condition, ends (the eviction API and the scheduler set the condition first and delete just after; the kubelet
    kills within the grace period). None when the head is not draining (neither, stopped, its node down, the driver
    done)."""
    head, job = obs.head, obs.rayjob
    if obs.backend != "kuberay" or head is None:
        return None
    if head.deleting and head.deletion_deadline is not None:
        end = head.deletion_deadline
    elif head.disruption and head.disruption_since is not None and not head.deleting:
        end = head.disruption_since + datetime.timedelta(seconds=head.grace_seconds)
    else:
        return None
    if head.phase != "Running" or head.node_ready is False or head.node_gone or obs.exit_code is not None:
        return None
    if job is not None and job.job_status in _JOB_ENDED:
        return None
    left = (end - ctx.now).total_seconds() + DRAIN_SLACK_SECONDS
    return left if left > 0 else None


def _head_lost(obs: AttemptObservation, ctx: Context) -> str:
    for pod in (*obs.pods, *obs.departed):
        why = _head_disruption(pod) if pod.is_head else ""
        if why:
            return why
    head = _not_ready_head(obs)
    return _head_not_ready(head, ctx)[0] if head is not None else ""


def grace_left(obs: AttemptObservation, ctx: Context) -> float | None:
    """Seconds until the head's NotReady node, or the end of a deleted head's grace period, ends the attempt if
    nothing changes (None: neither), for the decision to look again then. Only meaningful while `classify` says
    the attempt is still going."""
    draining = _draining_head(obs, ctx)
    if draining is not None:
        return draining
    head = _not_ready_head(obs)
    return _head_not_ready(head, ctx)[1] if head is not None else None


def _tearing_down(obs: AttemptObservation) -> bool:
    """The Ray cluster is going away as a whole: the job ended, the RayJob is being deleted, or the head is going."""
    job, head = obs.rayjob, obs.head
    if job is not None and (job.deleting or job.job_status in _JOB_ENDED or job.deployment_status in _DEPLOYMENT_ENDED):
        return True
    return head is None or head.deleting


def _worker_cause(pod: PodObservation, teardown: bool) -> str:
    if pod.disruption:
        return f"DisruptionTarget: {pod.disruption}"
    if pod.reason in EVICTION_REASONS:
        return pod.reason
    if pod.node_gone:
        return f"its node {pod.node_name} is gone"
    if pod.deleting and not teardown:
        return "deleted"
    return ""


def lost_workers(obs: AttemptObservation) -> tuple[LostWorker, ...]:
    """The attempt's worker pods that are lost, present or departed, each once. A worker deleted while the whole
    cluster goes (the cluster's own teardown) is not lost; nor is one whose node only stopped reporting."""
    teardown = _tearing_down(obs)
    found: dict[str, LostWorker] = {}
    for pod in (*obs.pods, *obs.departed):
        if pod.is_head or pod.name in found:
            continue
        cause = _worker_cause(pod, teardown)
        if cause:
            found[pod.name] = LostWorker(pod.name, cause)
    return tuple(found.values())


def _config_mismatch(said: str) -> Outcome:
    """InvalidSpec, its message the driver's ConfigMismatch line in `said` (the fields, old -> new, and the fix)."""
    detail = contract.said_after(Prefix.CONFIG_MISMATCH, said) or (
        "spec.trainer: the math differs from the checkpoint's (the driver did not say which fields). A checkpoint "
        "resumes only under the math that wrote it: to resume from this run's checkpoints, set it back and start "
        "the run again (re-create the TrainingRun under the same name, or run `trainingrun run` again); to train "
        "with the new config, start a TrainingRun of another name from scratch"
    )
    return Outcome(FailureClass.APPLICATION_FAILURE, detail, permanent=True, invalid_spec=True)


def _restore_interrupted(said: str, code: int | None = None) -> Outcome:
    """InfrastructureFailure: the restore failed through no fault of the checkpoint; the step is not blamed."""
    why = contract.said_after(Prefix.RESTORE_INTERRUPTED, said) or "not by the checkpoint (I/O, Ray, a timeout)"
    exited = "" if code is None else f", exit code {code}"
    return Outcome(
        FailureClass.INFRASTRUCTURE_FAILURE,
        f"the driver's restore was interrupted{exited}: {why}; the next attempt resumes from the same step",
    )


def _from_restore_error(report: str) -> Outcome:
    """Rule 1: `status.runtime.restoreError`, by its prefix (see the module docstring)."""
    if report.startswith(Prefix.CONFIG_MISMATCH):
        return _config_mismatch(report)
    if report.startswith(Prefix.RESTORE_INTERRUPTED):
        return _restore_interrupted(report)
    return Outcome(FailureClass.FAILED_RESTORE, contract.line(Prefix.RESTORE_FAILED, report))


def _from_exit_code(code: int, message: str) -> Outcome:
    if code == Exit.OK:
        return SUCCESS
    # Before the restore's own check: a driver of an older version wrote "RestoreFailed: ConfigMismatch: ..." (3).
    if code == Exit.CONFIG_MISMATCH or Prefix.CONFIG_MISMATCH in message:
        return _config_mismatch(message)
    if code == Exit.RESTORE_INTERRUPTED or Prefix.RESTORE_INTERRUPTED in message:
        return _restore_interrupted(message, code)
    if code == Exit.RESTORE_FAILED or Prefix.RESTORE_FAILED in message:
        return Outcome(FailureClass.FAILED_RESTORE, f"the driver could not restore (exit code {code})")
    if code == Exit.GENERATION_LOST or Prefix.GENERATION_LOST in message:
        return Outcome(
            FailureClass.PREEMPTED,
            "no generation worker came back within spec.restartPolicy.workerReplacementSeconds "
            f"(the driver exited with code {code}, GenerationLost)",
        )
    if code == Exit.TRAINER_LOST or Prefix.TRAINER_LOST in message:
        return Outcome(
            FailureClass.PREEMPTED,
            "a trainer rank's pod (a worker group of role trainer) left the Ray cluster; the next attempt resumes "
            f"from the newest checkpoint (the driver exited with code {code}, TrainerLost)",
        )
    if code == Exit.PREEMPTED or Prefix.PREEMPTED in message:
        return Outcome(
            FailureClass.PREEMPTED,
            f"the head pod was being deleted; the driver saved on its notice and stopped (exit code {code})",
        )
    if code == Exit.BAD_CONFIG:
        return Outcome(
            FailureClass.APPLICATION_FAILURE, f"the driver rejected its configuration (exit code {code})", True
        )
    return Outcome(FailureClass.APPLICATION_FAILURE, f"the driver exited with code {code}")


def _from_rayjob(obs: AttemptObservation) -> Outcome | None:
    job = obs.rayjob
    if job is None:
        return None
    if job.job_status == "SUCCEEDED":
        return SUCCESS
    if job.reason in ("SubmissionFailed", "ValidationFailed") or job.deployment_status == "ValidationFailed":
        permanent = job.reason == "ValidationFailed" or job.deployment_status == "ValidationFailed"
        return Outcome(FailureClass.INFRASTRUCTURE_FAILURE, f"KubeRay: {job.reason}: {job.message}".strip(), permanent)
    if job.job_status == "FAILED" or job.reason == "AppFailed":
        code = exit_code_from_message(job.message)
        if code is None:
            code = next((prefix.code for prefix in _SOUGHT if prefix in job.message), None)
        if code is not None:
            return _from_exit_code(code, job.message)
        return Outcome(FailureClass.APPLICATION_FAILURE, f"the Ray job failed: {job.message}".strip())
    if job.job_status == "STOPPED" or job.deployment_status == "Failed":
        return Outcome(FailureClass.INFRASTRUCTURE_FAILURE, f"KubeRay: {job.reason or job.job_status}: {job.message}")
    return None


def _from_pods(obs: AttemptObservation, running: bool) -> Outcome | None:
    for pod in obs.pods:
        if pod.waiting_reason in _IMAGE_ERRORS:
            return Outcome(FailureClass.INFRASTRUCTURE_FAILURE, f"pod {pod.name}: {pod.waiting_reason}")
    head = obs.head
    job_running = obs.rayjob is not None and obs.rayjob.deployment_status == "Running"
    if head is None:
        if running or job_running:
            return Outcome(FailureClass.INFRASTRUCTURE_FAILURE, "the head pod is gone")
        return None
    if head.deleting:
        return Outcome(FailureClass.INFRASTRUCTURE_FAILURE, f"the head pod {head.name} is being deleted")
    if head.phase in ("Failed", "Succeeded"):
        why = head.termination_reason or f"exit code {head.exit_code}"
        return Outcome(FailureClass.INFRASTRUCTURE_FAILURE, f"the head pod {head.name} terminated ({why})")
    return None


def classify(obs: AttemptObservation, ctx: Context) -> Outcome | None:
    """The outcome of the attempt `obs` describes, or None while it is still going (see the module docstring)."""
    outcome = _classify(obs, ctx)
    if outcome is None or outcome.failure is not FailureClass.APPLICATION_FAILURE or outcome.permanent:
        return outcome
    if not ctx.workers_lost:
        return outcome
    last, count = ctx.workers_lost[-1], len(ctx.workers_lost)
    also = f" ({count} worker pods lost in this attempt)" if count > 1 else ""
    return Outcome(FailureClass.PREEMPTED, f"{outcome.detail}, after worker pod {last} was lost{also}")


def _classify(obs: AttemptObservation, ctx: Context) -> Outcome | None:
    if ctx.restore_error:
        return _from_restore_error(ctx.restore_error)
    if _draining_head(obs, ctx) is not None:
        return None  # the driver may be saving on the notice: its report must still count
    why = _head_lost(obs, ctx)
    if why:
        return Outcome(FailureClass.PREEMPTED, why)
    job = obs.rayjob
    if job is not None and ctx.running and (job.suspend or job.deployment_status in ("Suspending", "Suspended")):
        return Outcome(FailureClass.PREEMPTED, f"RayJob {job.name} was suspended by a queue")
    if job is not None and ctx.admitted and job.suspend:
        return Outcome(FailureClass.PREEMPTED, f"RayJob {job.name} was suspended by a queue after it was admitted")
    if obs.exit_code is not None:
        return _from_exit_code(obs.exit_code, obs.stderr_tail)
    verdict = _from_rayjob(obs)
    if verdict is not None:
        return verdict
    verdict = _from_pods(obs, ctx.running)
    if verdict is not None:
        return verdict
    if obs.backend == "kuberay" and job is None and ctx.running:
        return Outcome(FailureClass.INFRASTRUCTURE_FAILURE, "the RayJob was deleted")
    return _stalled(obs, ctx)


def _stalled(obs: AttemptObservation, ctx: Context) -> Outcome | None:
    """Rule 9. A head on a NotReady node is left to rule 2: its silence is the node's, and the grace is the node's."""
    if ctx.watch is None or not ctx.running or _not_ready_head(obs) is not None:
        return None
    why = ctx.watch.verdict(ctx.now)
    return Outcome(FailureClass.STALLED, why) if why else None
