"""Why an attempt ended: the failure classes and the rules that map observations to them. Pure.

Called by `decision.py` on every reconcile of a Starting or Running attempt. The rules run in a fixed order;
the first that matches decides (a disrupted pod explains a failed job, so disruption is checked before the
job's own verdict):

1. the driver reported a restore error for this attempt           -> FailedRestore
2. any pod of the attempt has (or, now gone, was last seen with) DisruptionTarget,
   was Evicted or Preempted, or sits on a node that is gone or NotReady -> Preempted
3. the RayJob was suspended by someone else (a Kueue-style queue)
   after the attempt was running                                  -> Preempted
4. the driver's exit code is known (local mode, or parsed from
   KubeRay's message): 0 succeeded, 3 / "RestoreFailed:" -> FailedRestore,
   2 (bad config) -> ApplicationFailure (permanent), else -> ApplicationFailure
5. KubeRay's verdict: SUCCEEDED -> success; SubmissionFailed, ValidationFailed, STOPPED,
   grace period exceeded -> InfrastructureFailure; AppFailed / FAILED -> ApplicationFailure
6. an image that cannot be pulled, a container config error       -> InfrastructureFailure
7. the head pod is gone, being deleted or terminated while the attempt
   should be running (KubeRay 1.5 leaves the RayJob Running forever) -> InfrastructureFailure
8. the RayJob itself disappeared after the attempt was running     -> InfrastructureFailure
Otherwise the attempt is still going (None).
"""

from __future__ import annotations

import dataclasses
import enum

from trainingrun_operator.observation import (
    EVICTION_REASONS,
    AttemptObservation,
    PodObservation,
    exit_code_from_message,
)

__all__ = ["FailureClass", "Outcome", "classify"]

EXIT_BAD_CONFIG = 2
EXIT_RESTORE_FAILED = 3
RESTORE_FAILED_PREFIX = "RestoreFailed:"

_IMAGE_ERRORS = frozenset(
    {"ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError", "CreateContainerError"}
)


class FailureClass(str, enum.Enum):
    """Why an attempt ended badly; each class is charged to one budget (see `restarts.py`)."""

    PREEMPTED = "Preempted"  # the platform took the pods away; charged to the preemption budget
    APPLICATION_FAILURE = "ApplicationFailure"  # the driver exited non-zero on its own; failure budget
    INFRASTRUCTURE_FAILURE = "InfrastructureFailure"  # submission failed, image pull, head lost; failure budget
    FAILED_RESTORE = "FailedRestore"  # the checkpoint to resume from is corrupt or mismatched; failure budget


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How an attempt ended: success, or a failure class with a human-readable detail."""

    failure: FailureClass | None
    detail: str
    permanent: bool = False  # retrying cannot help (bad config, an invalid RayJob)

    @property
    def succeeded(self) -> bool:
        return self.failure is None


SUCCESS = Outcome(failure=None, detail="the driver finished")


def _disruption(pod: PodObservation) -> str:
    if pod.disruption:
        return f"pod {pod.name} has DisruptionTarget ({pod.disruption})"
    if pod.reason in EVICTION_REASONS:
        return f"pod {pod.name} was {pod.reason}"
    if pod.node_gone:
        return f"node {pod.node_name} of pod {pod.name} is gone"
    if pod.node_ready is False:
        return f"node {pod.node_name} of pod {pod.name} is not Ready (its Ready condition is False or Unknown)"
    return ""


def _from_exit_code(code: int, message: str) -> Outcome:
    if code == 0:
        return SUCCESS
    if code == EXIT_RESTORE_FAILED or RESTORE_FAILED_PREFIX in message:
        return Outcome(FailureClass.FAILED_RESTORE, f"the driver could not restore (exit code {code})")
    if code == EXIT_BAD_CONFIG:
        return Outcome(FailureClass.APPLICATION_FAILURE, "the driver rejected its configuration (exit code 2)", True)
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
        if code is not None or RESTORE_FAILED_PREFIX in job.message:
            return _from_exit_code(code if code is not None else EXIT_RESTORE_FAILED, job.message)
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


def classify(obs: AttemptObservation, *, running: bool, restore_error: str | None) -> Outcome | None:
    """The outcome of the attempt `obs` describes, or None while it is still going.

    `running`: the attempt reached Running (so a missing head or RayJob means it was lost, not not-yet-made).
    `restore_error`: `status.runtime.restoreError` if the report belongs to this attempt.
    """
    if restore_error:
        return Outcome(FailureClass.FAILED_RESTORE, f"{RESTORE_FAILED_PREFIX} {restore_error}")
    for pod in (*obs.pods, *obs.departed):
        why = _disruption(pod)
        if why:
            return Outcome(FailureClass.PREEMPTED, why)
    job = obs.rayjob
    if job is not None and running and (job.suspend or job.deployment_status in ("Suspending", "Suspended")):
        return Outcome(FailureClass.PREEMPTED, f"RayJob {job.name} was suspended by a queue")
    if obs.exit_code is not None:
        return _from_exit_code(obs.exit_code, obs.stderr_tail)
    verdict = _from_rayjob(obs)
    if verdict is not None:
        return verdict
    verdict = _from_pods(obs, running)
    if verdict is not None:
        return verdict
    if obs.backend == "kuberay" and job is None and running:
        return Outcome(FailureClass.INFRASTRUCTURE_FAILURE, "the RayJob was deleted")
    return None
