"""Restart budgets and backoff. Pure; `decision.py` charges every ended attempt here.

Budgets are separate by cause:
- Preempted attempts are charged to `restartPolicy.preemptionBudget` (absent = unlimited): the run survives
  that many preemptions in total, the next one fails it. They never count as failures and restart without
  backoff, since the platform, not the job, ended them.
- ApplicationFailure, InfrastructureFailure, FailedRestore and Stalled are charged to `restartPolicy.failureBudget`:
  the run fails when that many attempts in a row have failed. An attempt that recorded a new checkpoint
  resets the count (done where the checkpoint is recorded), so a long run that fails rarely never runs out.
  The delay before the next attempt is initialSeconds * factor**(n-1), capped at maxSeconds.
"""

from __future__ import annotations

import dataclasses

from trainingrun_operator.core import model
from trainingrun_operator.core.classification import FailureClass

__all__ = ["Charge", "backoff_seconds", "charge"]

_COUNTER = {
    FailureClass.PREEMPTED: "preempted",
    FailureClass.APPLICATION_FAILURE: "application_failure",
    FailureClass.INFRASTRUCTURE_FAILURE: "infrastructure_failure",
    FailureClass.FAILED_RESTORE: "failed_restore",
    FailureClass.STALLED: "stalled",
}


@dataclasses.dataclass(frozen=True)
class Charge:
    """The result of charging one ended attempt: new counters, whether a budget ran out, and the delay."""

    restarts: model.RestartCounts
    consecutive_failures: int
    exhausted: str  # "" while budgets remain, else a message naming the budget
    delay_seconds: float


def backoff_seconds(backoff: model.Backoff, consecutive_failures: int) -> float:
    """initialSeconds * factor**(n-1) capped at maxSeconds; 0 for n <= 0 (no failure, no wait)."""
    if consecutive_failures <= 0:
        return 0.0
    delay = backoff.initial_seconds
    for _ in range(consecutive_failures - 1):
        if delay >= backoff.max_seconds:
            break
        delay *= backoff.factor
    return float(min(delay, backoff.max_seconds))


def charge(
    policy: model.RestartPolicy,
    restarts: model.RestartCounts,
    consecutive_failures: int,
    failure: FailureClass,
) -> Charge:
    """Count one attempt that ended with `failure` and say whether its budget is exhausted."""
    field = _COUNTER[failure]
    counts = restarts.model_copy(update={field: getattr(restarts, field) + 1, "total": restarts.total + 1})
    if failure is FailureClass.PREEMPTED:
        budget = policy.preemption_budget
        exhausted = ""
        if budget is not None and counts.preempted > budget:
            exhausted = f"preemption budget exhausted ({counts.preempted} preemptions, budget {budget})"
        return Charge(counts, consecutive_failures, exhausted, 0.0)
    consecutive = consecutive_failures + 1
    exhausted = ""
    if consecutive >= policy.failure_budget:
        exhausted = f"failure budget exhausted ({consecutive} consecutive failures, budget {policy.failure_budget})"
    return Charge(counts, consecutive, exhausted, backoff_seconds(policy.backoff, consecutive))
