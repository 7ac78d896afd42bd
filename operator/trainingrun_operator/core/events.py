"""The Kubernetes events the operator posts on a TrainingRun: their reasons and their types. Pure.

Every event goes through these two enums: the decision core (`decision.Event`), the reconciler's API calls
(`reconciler._event`), the kopf edge's failed pass (`handlers._post_failure`) and local mode's `--chaos`
(`local.LocalRun.event`, which writes DIR/local/<run>/events.jsonl and the console instead of the API server).
`apiclient.Api.post_event` takes them, not strings, so mypy refuses a reason typed as a literal.

The values are on the wire: users' alerts and `kubectl get events --field-selector reason=...` select on them,
so a value never changes (tests/unit/operator/test_event_reasons.py pins every one). A member's name may.

Several reasons are also written as `status.reason` or as an attempt's end (`decision.move`, `end_attempt`):
the event and the status say the same word. This is not the driver's event log (`trainingrun_runtime.driver.
events`), whose entries are the driver's own.
"""

from __future__ import annotations

import enum

from trainingrun_operator.core.classification import FailureClass

__all__ = ["Reason", "Type", "for_failure"]


class Type(str, enum.Enum):
    """An event's type (`type` on the wire): what `kubectl describe` and `kubectl get events` show."""

    NORMAL = "Normal"  # something the run does as planned
    WARNING = "Warning"  # something went wrong, or the operator refused something

    def __str__(self) -> str:
        return self.value  # the wire value in f-strings and logs, not "Type.NORMAL"


class Reason(str, enum.Enum):
    """Every reason the operator posts an event with (`reason` on the wire), and when."""

    # -- an attempt's life (decision.py)
    ATTEMPT_STARTED = "AttemptStarted"  # Normal: a new attempt's RayJob is named and created; says where it resumes
    QUEUED = "Queued"  # Normal: the attempt's RayJob waits, suspended, for Kueue to admit it
    ADMITTED = "Admitted"  # Normal: Kueue admitted a queued attempt (its RayJob unsuspended); says how long it waited
    ATTEMPT_RUNNING = "AttemptRunning"  # Normal: the attempt's Ray cluster and driver are running
    WORKER_LOST = "WorkerLost"  # Warning: a worker pod of the running attempt was lost (once per pod)
    CHECKPOINT_RECORDED = "CheckpointRecorded"  # Normal: a checkpoint the current attempt reported is recorded
    PREEMPTION_NOTICE = "PreemptionNotice"  # Normal: that checkpoint was saved on the head pod's notice
    CHECKPOINT_CORRUPT = "CheckpointCorrupt"  # Warning: the driver passed over a recorded step that failed verification
    RESTARTING = "Restarting"  # Normal: an attempt ended with a failure class; the next starts after the backoff
    SUSPENDED = "Suspended"  # Normal: spec.suspend is true; no attempt runs
    SUCCEEDED = "Succeeded"  # Normal: the driver finished; the run succeeded

    # -- an attempt ended with a failure class (decision.py; one per FailureClass, same value: `for_failure`)
    PREEMPTED = "Preempted"  # Warning: the platform took the attempt's pods away
    APPLICATION_FAILURE = "ApplicationFailure"  # Warning: the driver exited non-zero on its own
    INFRASTRUCTURE_FAILURE = "InfrastructureFailure"  # Warning: submission failed, an image pull, the head lost
    FAILED_RESTORE = "FailedRestore"  # Warning: the checkpoint to resume from failed verification
    STALLED = "Stalled"  # Warning: the driver stopped reporting steps

    # -- the run failed (decision.py)
    INVALID_SPEC = "InvalidSpec"  # Warning: the spec cannot run as it is; names the field
    PERMANENT_FAILURE = "PermanentFailure"  # Warning: the attempt's failure is one that retrying cannot help
    BUDGET_EXHAUSTED = "BudgetExhausted"  # Warning: the restart budget of the failure's class is spent
    NO_RESTORABLE_CHECKPOINT = "NoRestorableCheckpoint"  # Warning: every recorded checkpoint failed to restore

    # -- the API calls of a pass (reconciler.py)
    CREATED_RAY_JOB = "CreatedRayJob"  # Normal: the attempt's RayJob was created
    ADOPTED_RAY_JOB = "AdoptedRayJob"  # Normal: the run's own RayJob was already there (409) and is used
    FAILED_TO_CREATE_RAY_JOB = "FailedToCreateRayJob"  # Warning: creating the RayJob failed; the pass is retried
    DELETED_RAY_JOB = "DeletedRayJob"  # Normal: an attempt's RayJob was deleted
    FAILED_TO_DELETE_RAY_JOB = "FailedToDeleteRayJob"  # Warning: deleting a RayJob failed; the pass is retried
    UPDATED_NETWORK_POLICY = "UpdatedNetworkPolicy"  # Normal: the run's NetworkPolicy was set back to the operator's
    FOREIGN_OBJECT = "ForeignObject"  # Warning: an object under one of the run's names is not the run's; refused
    FOREIGN_OBJECT_GONE = "ForeignObjectGone"  # Normal: after such a refusal, the run's own objects are in place

    # -- the kopf edge (handlers.py)
    FAILED_TO_RECONCILE = "FailedToReconcile"  # Warning: a pass raised an unexpected exception; it is retried

    # -- local mode (local.py)
    CHAOS_KILL = "ChaosKill"  # Warning: `trainingrun run --chaos` SIGKILLed the attempt's driver

    def __str__(self) -> str:
        return self.value  # the wire value in f-strings and logs, not "Reason.WORKER_LOST"


_FAILURES: dict[FailureClass, Reason] = {
    FailureClass.PREEMPTED: Reason.PREEMPTED,
    FailureClass.APPLICATION_FAILURE: Reason.APPLICATION_FAILURE,
    FailureClass.INFRASTRUCTURE_FAILURE: Reason.INFRASTRUCTURE_FAILURE,
    FailureClass.FAILED_RESTORE: Reason.FAILED_RESTORE,
    FailureClass.STALLED: Reason.STALLED,
}


def for_failure(failure: FailureClass) -> Reason:
    """The reason of the Warning event for an attempt that ended with `failure` (the class's own value)."""
    return _FAILURES[failure]
