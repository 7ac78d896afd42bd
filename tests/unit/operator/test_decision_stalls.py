"""The decision core's stall watchdog: a driver silent past the progress deadline (or without a first report
within the start-up bound) ends as Stalled, charged to the failure budget, on the cluster and locally.

Journeys against an in-memory status (`support.decisions.Store`).
"""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from support.decisions import Store, creates, deleting, gone, running, spec_doc, start_and_run
from trainingrun_operator.core.decision import CreateAttempt, DeleteRayJob, Event
from trainingrun_operator.core.observation import AttemptObservation, PodObservation
from trainingrun_runtime import timestamps


def watched(**policy: Any) -> Store:
    """A store whose spec has the stall watchdog on: 60 s between reports, 300 s to the first one."""
    return Store(
        spec_doc(
            restartPolicy={
                "failureBudget": 3,
                "backoff": {"initialSeconds": 10, "maxSeconds": 40, "factor": 2},
                "progressDeadlineSeconds": 60,
                "startupDeadlineSeconds": 300,
                **policy,
            }
        )
    )


def step_reported(store: Store, step: int, checkpoint: int | None = None) -> None:
    """The driver's report of `step` now (status.runtime.updated), keeping the last checkpoint it reported."""
    runtime = store.status.get("runtime") or {}
    ckpt = runtime.get("lastCheckpoint")
    if checkpoint is not None:
        ckpt = {"step": checkpoint, "path": f"/checkpoints/tiny/step_{checkpoint}", "attempt": store.attempt(),
                "time": timestamps.rfc3339(store.now)}  # fmt: skip
    store.status["runtime"] = {
        "attempt": store.attempt(),
        "step": step,
        "updated": timestamps.rfc3339(store.now),
        "finished": False,
        "lastCheckpoint": ckpt,
    }


def after(store: Store, seconds: float) -> None:
    store.now += datetime.timedelta(seconds=seconds)


def test_a_driver_silent_past_the_deadline_ends_as_stalled_and_the_next_attempt_resumes_from_the_recorded_step() -> (
    None
):
    store = watched()
    start_and_run(store)
    assert store.status["attempt"]["runningSince"] == "2025-01-01T00:00:00Z"
    after(store, 40)
    step_reported(store, 10, checkpoint=10)
    assert store.decide(running(1)).requeue_after == pytest.approx(60), "looks again when the deadline would pass"
    after(store, 20)
    step_reported(store, 12)
    assert store.decide(running(1)).requeue_after == pytest.approx(60), "a new report moves the deadline"
    after(store, 59)
    assert store.decide(running(1)).requeue_after == pytest.approx(1) and store.phase == "Running"

    after(store, 1)
    result = store.decide(running(1))
    assert store.phase == "Restarting" and store.status["reason"] == "Stalled"
    assert DeleteRayJob("tiny-a1") in result.actions
    why = (
        "the driver reported no new step for 60s: its last report was step 12 at 2025-01-01T00:01:00Z "
        "(spec.restartPolicy.progressDeadlineSeconds: 60)"
    )
    assert Event("Warning", "Stalled", f"attempt 1 ended: {why}") in result.actions
    (ended,) = store.status["attempts"]
    assert (ended["reason"], ended["message"], ended["stepsLost"]) == ("Stalled", why, 2)
    running_condition = next(c for c in store.status["conditions"] if c["type"] == "Running")
    assert running_condition["status"] == "False" and running_condition["reason"] == "Stalled"
    assert why in running_condition["message"]
    assert store.status["restarts"]["stalled"] == 1 and store.status["restarts"]["total"] == 1
    assert store.status["consecutiveFailures"] == 1, "charged to the failure budget"

    store.decide(deleting(1))
    after(store, 10)  # the backoff
    (create,) = creates(store.decide(gone(1)))
    assert create == CreateAttempt(2, "tiny-a2", 10)


def test_a_slow_start_is_judged_against_the_start_up_bound_not_the_progress_deadline() -> None:
    store = watched()
    start_and_run(store)
    after(store, 299)
    assert store.decide(running(1)).requeue_after == pytest.approx(1)
    assert store.phase == "Running", "299 s without a report, far past the 60 s progress deadline, is a slow start"
    step_reported(store, 1)
    assert store.decide(running(1)).requeue_after == pytest.approx(60)
    after(store, 60)
    store.decide(running(1))
    assert store.phase == "Restarting" and store.status["reason"] == "Stalled"


def test_no_first_report_within_the_start_up_bound_is_a_stall() -> None:
    store = watched()
    start_and_run(store)
    after(store, 300)
    store.decide(running(1))
    assert store.phase == "Restarting" and store.status["reason"] == "Stalled"
    assert "startupDeadlineSeconds: 300" in store.status["attempts"][0]["message"]


def test_the_start_up_bound_counts_from_running_not_from_the_attempts_start() -> None:
    store = watched()
    store.decide()
    after(store, 250)  # the RayJob takes its time: pods scheduled, images pulled, the Ray cluster started
    store.decide(running(1))
    assert store.status["attempt"]["runningSince"] == "2025-01-01T00:04:10Z"
    after(store, 100)
    assert store.decide(running(1)).requeue_after == pytest.approx(200) and store.phase == "Running"


def test_without_a_progress_deadline_a_silent_driver_runs_on() -> None:
    store = Store()  # spec_doc's restartPolicy sets no progressDeadlineSeconds
    start_and_run(store)
    step_reported(store, 3)
    after(store, 86_400)
    result = store.decide(running(1))
    assert store.phase == "Running" and result.requeue_after is None


def test_stalls_in_a_row_exhaust_the_failure_budget() -> None:
    store = watched(failureBudget=2)
    for n in (1, 2):
        start_and_run(store)
        after(store, 300)
        store.decide(running(n))
        after(store, 60)
    assert store.phase == "Failed" and store.status["reason"] == "BudgetExhausted"
    assert store.status["restarts"]["stalled"] == 2


def local_driver(n: int, *, exited: bool = False) -> AttemptObservation:
    """A local attempt: no RayJob, its driver process as the head pod (local.py's observation)."""
    pod = PodObservation(name="driver-4242", node_type="head", phase="Failed" if exited else "Running", deleting=exited)
    return AttemptObservation(number=n, backend="local", pods=(pod,))


def test_a_stalled_local_driver_is_killed_until_its_processes_are_gone_then_the_next_attempt_starts() -> None:
    store = watched()
    store.decide()
    store.decide(local_driver(1))
    assert store.phase == "Running"
    step_reported(store, 5, checkpoint=5)
    after(store, 60)
    result = store.decide(local_driver(1))
    assert store.phase == "Restarting" and store.status["reason"] == "Stalled"
    assert DeleteRayJob("tiny-a1") in result.actions, "the local backend kills the attempt's processes on this"
    after(store, 10)
    again = store.decide(local_driver(1, exited=True))
    assert DeleteRayJob("tiny-a1") in again.actions and creates(again) == [], "killed again while any is left"
    (create,) = creates(store.decide(AttemptObservation(number=1, backend="local")))
    assert create == CreateAttempt(2, "tiny-a2", 5)
