"""The decision core when an attempt ends badly: what it is charged to (preemption, application or
infrastructure failure, a permanent exit), the budgets and the growing backoff, and the attempt's history entry.

Journeys against an in-memory status (`support.decisions.Store`).
"""

from __future__ import annotations

import datetime
import re

import pytest

from support.decisions import Store, creates, deleting, failed, gone, preempted, running, spec_doc, start_and_run
from trainingrun_operator.core.decision import CreateAttempt, DeleteRayJob, EnsureIdentity
from trainingrun_operator.core.observation import AttemptObservation, RayJobObservation
from trainingrun_runtime import timestamps


def test_preemption_leads_to_attempt_two_from_the_recorded_step_without_touching_the_failure_budget() -> None:
    store = Store()
    start_and_run(store)
    store.report(1, 15)
    store.decide(running(1))
    assert store.status["checkpoints"]["latest"]["step"] == 15

    result = store.decide(preempted(1))
    assert store.phase == "Restarting"
    assert store.status["reason"] == "Preempted"
    assert DeleteRayJob("tiny-a1") in result.actions
    assert store.status["restarts"] == {
        "total": 1,
        "preempted": 1,
        "applicationFailure": 0,
        "infrastructureFailure": 0,
        "failedRestore": 0,
        "stalled": 0,
    }
    assert store.status.get("consecutiveFailures", 0) == 0
    assert store.status["attempts"][0]["reason"] == "Preempted"

    assert creates(store.decide(deleting(1))) == [], "no new attempt while the old attempt's pods exist"
    result = store.decide(gone(1))
    assert creates(result) == [CreateAttempt(2, "tiny-a2", 15)]
    assert not any(isinstance(a, EnsureIdentity) for a in result.actions), "the identity exists since attempt 1"
    assert store.status["attempt"]["resumedFrom"] == 15
    assert store.phase == "Starting"


def test_three_application_failures_fail_the_run_with_growing_backoff() -> None:
    store = Store()
    delays = []
    for n in (1, 2, 3):
        start_and_run(store)
        store.decide(failed(n))
        if n < 3:
            assert store.phase == "Restarting"
            due = store.status["nextAttemptTime"]
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", due), "to the millisecond, in UTC"
            wake = timestamps.parse(due)
            delays.append((wake - store.now).total_seconds())
            early = store.decide(gone(n))
            assert creates(early) == [] and early.requeue_after == pytest.approx(delays[-1])
            store.now = wake
    assert delays == [10.0, 20.0]
    assert store.phase == "Failed"
    assert store.status["reason"] == "BudgetExhausted"
    assert store.status["restarts"]["applicationFailure"] == 3
    failed_condition = next(c for c in store.status["conditions"] if c["type"] == "Failed")
    assert failed_condition["status"] == "True" and failed_condition["observedGeneration"] == 1


def test_a_new_checkpoint_resets_the_consecutive_failure_count() -> None:
    store = Store()
    for n in (1, 2):
        start_and_run(store)
        store.decide(failed(n))
        store.now += datetime.timedelta(minutes=5)
    assert store.status["consecutiveFailures"] == 2
    start_and_run(store)
    store.report(3, 10)
    store.decide(running(3))
    assert store.status["consecutiveFailures"] == 0
    store.decide(failed(3))
    assert store.phase == "Restarting" and store.status["consecutiveFailures"] == 1


def test_a_failed_restore_of_the_drivers_own_choice_fails_the_run() -> None:
    store = Store()
    start_and_run(store)
    store.decide(failed(1, code=3))
    assert store.phase == "Failed" and store.status["reason"] == "PermanentFailure"
    assert "FailedRestore" in store.status["message"]


def test_a_bad_config_exit_fails_at_once() -> None:
    store = Store()
    start_and_run(store)
    result = store.decide(failed(1, code=2))
    assert store.phase == "Failed" and store.status["reason"] == "PermanentFailure"
    assert DeleteRayJob("tiny-a1") in result.actions


def test_a_preemption_budget_fails_the_run_on_the_preemption_after_it() -> None:
    store = Store(spec_doc(restartPolicy={"preemptionBudget": 1}))
    start_and_run(store)
    store.decide(preempted(1))
    start_and_run(store)
    store.decide(preempted(2))
    assert store.phase == "Failed" and "preemption budget exhausted" in store.status["message"]


def test_head_pod_gone_while_the_rayjob_says_running_ends_the_attempt() -> None:
    store = Store()
    start_and_run(store)
    headless = AttemptObservation(
        number=1, rayjob=RayJobObservation(name="tiny-a1", deployment_status="Running", job_status="RUNNING")
    )
    result = store.decide(headless)
    assert store.phase == "Restarting" and store.status["reason"] == "InfrastructureFailure"
    assert DeleteRayJob("tiny-a1") in result.actions


def test_attempt_history_records_start_end_reason_resume_point_and_steps_lost() -> None:
    store = Store()
    start_and_run(store)
    store.report(1, 10)
    store.decide(running(1))
    store.status["runtime"]["step"] = 14  # progress beyond the checkpoint, as far as reported
    store.now += datetime.timedelta(minutes=3)
    store.decide(preempted(1))
    (record,) = store.status["attempts"]
    assert record == {
        "number": 1,
        "rayJobName": "tiny-a1",
        "start": "2025-01-01T00:00:00Z",
        "runningSince": "2025-01-01T00:00:00Z",
        "end": "2025-01-01T00:03:00Z",
        "reason": "Preempted",
        "message": record["message"],
        "stepsLost": 4,
        "workersLost": 0,
        "firstStep": record["firstStep"],  # the driver's first report of a step (goodput: test_goodput)
        "lastReport": record["lastReport"],
    }
