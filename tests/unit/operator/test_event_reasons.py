"""The operator's event reasons and types: their wire values are pinned (users' alerts and
`kubectl get events --field-selector reason=...` select on them), and the posting functions take the enums."""

from __future__ import annotations

import typing

from trainingrun_operator.core import decision, events
from trainingrun_operator.core.classification import FailureClass
from trainingrun_operator.kube import apiclient, reconciler

WIRE = {
    "ATTEMPT_STARTED": "AttemptStarted",
    "QUEUED": "Queued",
    "ADMITTED": "Admitted",
    "ATTEMPT_RUNNING": "AttemptRunning",
    "WORKER_LOST": "WorkerLost",
    "CHECKPOINT_RECORDED": "CheckpointRecorded",
    "PREEMPTION_NOTICE": "PreemptionNotice",
    "CHECKPOINT_CORRUPT": "CheckpointCorrupt",
    "RESTARTING": "Restarting",
    "SUSPENDED": "Suspended",
    "SUCCEEDED": "Succeeded",
    "PREEMPTED": "Preempted",
    "APPLICATION_FAILURE": "ApplicationFailure",
    "INFRASTRUCTURE_FAILURE": "InfrastructureFailure",
    "FAILED_RESTORE": "FailedRestore",
    "STALLED": "Stalled",
    "INVALID_SPEC": "InvalidSpec",
    "PERMANENT_FAILURE": "PermanentFailure",
    "BUDGET_EXHAUSTED": "BudgetExhausted",
    "NO_RESTORABLE_CHECKPOINT": "NoRestorableCheckpoint",
    "CREATED_RAY_JOB": "CreatedRayJob",
    "ADOPTED_RAY_JOB": "AdoptedRayJob",
    "FAILED_TO_CREATE_RAY_JOB": "FailedToCreateRayJob",
    "DELETED_RAY_JOB": "DeletedRayJob",
    "FAILED_TO_DELETE_RAY_JOB": "FailedToDeleteRayJob",
    "UPDATED_NETWORK_POLICY": "UpdatedNetworkPolicy",
    "FOREIGN_OBJECT": "ForeignObject",
    "FOREIGN_OBJECT_GONE": "ForeignObjectGone",
    "FAILED_TO_RECONCILE": "FailedToReconcile",
    "CHAOS_KILL": "ChaosKill",
}
"""Every reason the operator posts, by member, with the value it had before the enum (never change a value)."""


def test_every_reason_keeps_the_wire_value_users_select_on() -> None:
    assert {r.name: r.value for r in events.Reason} == WIRE


def test_the_event_types_are_kubernetes_normal_and_warning() -> None:
    assert {t.name: t.value for t in events.Type} == {"NORMAL": "Normal", "WARNING": "Warning"}


def test_reasons_and_types_print_as_their_wire_values() -> None:
    reason, kind = events.Reason.WORKER_LOST, events.Type.WARNING
    """As the console and the operator's log lines (`%s`, which calls str) show them."""
    assert (str(reason), f"{reason}", str(kind), f"{kind:8}|") == ("WorkerLost", "WorkerLost", "Warning", "Warning |")


def test_each_failure_class_posts_the_reason_of_its_own_value() -> None:
    assert {c: events.for_failure(c).value for c in FailureClass} == {c: c.value for c in FailureClass}


def test_the_posting_functions_take_the_enums_not_strings() -> None:
    """So `mypy --strict` refuses a reason or a type written as a literal at a call site."""
    for hints in (
        typing.get_type_hints(apiclient.Api.post_event),
        typing.get_type_hints(reconciler._event),
        typing.get_type_hints(decision.Event),
    ):
        kind = hints.get("type_") or hints.get("kind") or hints["type"]
        assert (kind, hints["reason"]) == (events.Type, events.Reason)
