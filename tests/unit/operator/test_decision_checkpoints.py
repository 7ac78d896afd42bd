"""The decision core over the driver's reports: which checkpoint is recorded (never a stale or ended attempt's,
but a notice checkpoint read late), the bounded history, the steps marked bad, and which steps the next attempt
is told to resume from.

Journeys against an in-memory status (`support.decisions.Store`).
"""

from __future__ import annotations

import datetime

from support.decisions import Store, creates, deleting, gone, preempted, running, start_and_run
from trainingrun_operator.core import decision
from trainingrun_operator.core.decision import CreateAttempt, Event
from trainingrun_operator.core.observation import AttemptObservation, RayJobObservation


def test_a_report_from_a_stale_attempt_is_ignored() -> None:
    store = Store()
    start_and_run(store)
    store.report(1, 10)
    store.decide(running(1))
    store.decide(preempted(1))
    store.decide(gone(1))
    store.decide(running(2))
    store.report(1, 20)  # a zombie of attempt 1 reports after attempt 2 started
    result = store.decide(running(2))
    assert store.status["checkpoints"]["latest"]["step"] == 10
    assert not any(isinstance(a, Event) and a.reason == "CheckpointRecorded" for a in result.actions)
    store.report(2, 20)
    store.decide(running(2))
    assert store.status["checkpoints"]["latest"] == {
        "step": 20,
        "path": "/checkpoints/tiny/step_20",
        "attempt": 2,
        "time": "2025-01-01T00:00:00Z",
    }
    assert [h["step"] for h in store.status["checkpoints"]["history"]] == [10, 20]


def test_a_report_of_an_ended_attempt_is_not_recorded_before_the_next_attempt_starts() -> None:
    store = Store()
    start_and_run(store)
    store.report(1, 10)
    store.decide(running(1))
    store.decide(preempted(1))
    assert store.phase == "Restarting"
    store.report(1, 15)  # attempt 1's driver lives on (a partitioned node) and saves once more
    result = store.decide(deleting(1))
    assert store.status["checkpoints"]["latest"]["step"] == 10
    assert not any(isinstance(a, Event) and a.reason == "CheckpointRecorded" for a in result.actions)
    store.now += datetime.timedelta(seconds=60)
    (create,) = creates(store.decide(gone(1)))
    assert create.resume == 10 and store.status["attempt"]["resumedFrom"] == 10


def test_the_final_report_of_a_succeeded_attempt_counts_when_read_after_the_rayjob_completed() -> None:
    store = Store()
    start_and_run(store)
    store.report(1, 35)
    store.decide(running(1))
    done = AttemptObservation(
        number=1, rayjob=RayJobObservation(name="tiny-a1", deployment_status="Complete", job_status="SUCCEEDED")
    )
    store.decide(done)
    assert store.phase == "Succeeded" and store.status["checkpoints"]["latest"]["step"] == 35
    store.report(1, 40, finished=True)  # the driver wrote it before exiting; this pass reads it late
    store.decide(done)
    assert store.phase == "Succeeded" and store.status["checkpoints"]["latest"]["step"] == 40


def test_checkpoint_history_is_bounded() -> None:
    store = Store()
    start_and_run(store)
    for step in range(5, 5 * (decision.MAX_CHECKPOINT_HISTORY + 10), 5):
        store.report(1, step)
        store.decide(running(1))
    history = store.status["checkpoints"]["history"]
    assert len(history) == decision.MAX_CHECKPOINT_HISTORY
    assert history[-1]["step"] == store.status["checkpoints"]["latest"]["step"]


def test_a_failed_restore_marks_the_step_bad_and_falls_back_to_the_previous_checkpoint() -> None:
    store = Store()
    start_and_run(store)
    store.report(1, 10)
    store.decide(running(1))
    store.report(1, 20)
    store.decide(running(1))
    store.decide(preempted(1))
    store.decide(gone(1))
    store.decide(running(2))
    store.status["runtime"] = {"attempt": 2, "step": 20, "restoreError": "policy/weights.pt: sha256 mismatch"}
    store.decide(running(2))
    assert store.phase == "Restarting" and store.status["reason"] == "FailedRestore"
    assert store.status["checkpoints"]["bad"] == [20]
    store.now += datetime.timedelta(minutes=1)
    assert creates(store.decide(gone(2))) == [CreateAttempt(3, "tiny-a3", 10)]


def preempted_after_checkpoints(store: Store, *steps: int) -> None:
    """Attempt 1 records `steps`, is preempted, and attempt 2 is created (pinned to the last of them)."""
    start_and_run(store)
    for step in steps:
        store.report(1, step)
        store.decide(running(1))
    store.decide(preempted(1))


def test_a_notice_checkpoint_read_after_the_attempt_ended_is_recorded_and_the_next_attempt_resumes_from_it() -> None:
    store = Store()
    preempted_after_checkpoints(store, 10)
    assert store.phase == "Restarting"
    store.report(1, 13)
    store.status["runtime"]["lastCheckpoint"]["reason"] = "Periodic"
    store.decide(deleting(1))
    assert store.status["checkpoints"]["latest"]["step"] == 10, "an ended attempt's periodic save is not recorded"
    store.report(1, 14)
    store.status["runtime"]["lastCheckpoint"]["reason"] = "PreemptionNotice"
    store.decide(deleting(1))
    assert store.status["checkpoints"]["latest"]["step"] == 14
    assert store.status["attempt"]["stepsLost"] == 0 and store.status["attempts"][0]["stepsLost"] == 0
    assert creates(store.decide(gone(1))) == [CreateAttempt(2, "tiny-a2", 14, (10,))]
    store.report(1, 15)
    store.status["runtime"]["lastCheckpoint"]["reason"] = "PreemptionNotice"
    store.decide(running(2))
    assert store.status["checkpoints"]["latest"]["step"] == 14, "once attempt 2 exists, attempt 1 says nothing"


def test_a_recorded_periodic_checkpoint_reported_again_as_the_notices_answer_is_recorded_as_the_notices() -> None:
    store = Store()
    start_and_run(store)
    store.report(1, 5)
    store.decide(running(1))
    store.report(1, 10, ckpt_attempt=1)
    store.status["runtime"]["lastCheckpoint"]["reason"] = "Periodic"
    recorded = store.decide(running(1))
    assert [a.reason for a in recorded.actions if isinstance(a, Event)] == ["CheckpointRecorded"]
    # the program saw the head's notice only after that save: it stops, its newest checkpoint answering the notice
    store.status["runtime"]["lastCheckpoint"]["reason"] = "PreemptionNotice"
    answered = store.decide(running(1))
    book = store.status["checkpoints"]
    assert book["latest"]["reason"] == "PreemptionNotice" and book["latest"]["step"] == 10
    assert [(h["step"], h.get("reason")) for h in book["history"]] == [(5, None), (10, "PreemptionNotice")]
    assert [a.reason for a in answered.actions if isinstance(a, Event)] == ["PreemptionNotice"]
    again = store.decide(running(1))
    assert not [a for a in again.actions if isinstance(a, Event)], "the answer is announced once"
    store.status["runtime"]["lastCheckpoint"]["reason"] = "Periodic"
    store.decide(running(1))
    assert store.status["checkpoints"]["latest"]["reason"] == "PreemptionNotice", "a notice's answer stays one"


def test_the_next_attempt_is_told_the_older_recorded_steps_newest_first_and_never_the_bad_ones() -> None:
    store = Store()
    preempted_after_checkpoints(store, 10, 20, 30, 40)
    store.status["checkpoints"]["bad"] = [20]
    assert creates(store.decide(gone(1))) == [CreateAttempt(2, "tiny-a2", 40, (30, 10))]


CORRUPT_20 = "/checkpoints/tiny/step_20/policy/model.pt: sha256 mismatch (expected 3f.., got 9a..)"


def fell_back_from_a_corrupt_step_20(store: Store) -> None:
    """Attempt 1 records steps 10 and 20 and is preempted; attempt 2, pinned to 20, finds it corrupt, falls back to
    10 and reports step 11 with step 20 passed over (what the driver reports, read by no pass yet)."""
    preempted_after_checkpoints(store, 10, 20)
    store.decide(gone(1))
    store.decide(running(2))
    store.report(2, 11, ckpt_attempt=1, badCheckpoints=[{"step": 20, "problem": CORRUPT_20}])
    store.status["runtime"]["lastCheckpoint"]["step"] = 10  # the step the driver fell back to


def test_a_pinned_step_that_failed_verification_is_marked_bad_announced_once_and_the_attempt_trains_on() -> None:
    store = Store()
    fell_back_from_a_corrupt_step_20(store)
    problem = CORRUPT_20
    result = store.decide(running(2))
    assert store.phase == "Running"
    assert store.status["checkpoints"]["bad"] == [20]
    assert store.status["attempt"]["resumedFrom"] == 10
    assert store.status["restarts"]["failedRestore"] == 0 and store.status["restarts"]["total"] == 1
    warnings = [a for a in result.actions if isinstance(a, Event) and a.reason == "CheckpointCorrupt"]
    assert len(warnings) == 1 and "step 20" in warnings[0].message and problem in warnings[0].message
    again = store.decide(running(2))
    assert not [a for a in again.actions if isinstance(a, Event) and a.reason == "CheckpointCorrupt"]


def test_a_step_marked_bad_leaves_the_list_once_the_attempt_saves_that_step_anew() -> None:
    store = Store()
    fell_back_from_a_corrupt_step_20(store)
    store.decide(running(2))
    assert store.status["checkpoints"]["bad"] == [20]
    store.report(2, 20, badCheckpoints=[{"step": 20, "problem": CORRUPT_20}])  # attempt 2's own save of step 20
    store.decide(running(2))
    assert store.status["checkpoints"]["latest"]["step"] == 20 and store.status["checkpoints"]["latest"]["attempt"] == 2
    assert not store.status["checkpoints"].get("bad"), store.status["checkpoints"]
    # Its later reports still list step 20 as passed over (the driver's restore did): that neither puts it back on
    # the list nor announces it again, and the next attempt resumes from it.
    ended = store.decide(preempted(2))
    assert not [a for a in ended.actions if isinstance(a, Event) and a.reason == "CheckpointCorrupt"]
    assert not store.status["checkpoints"].get("bad"), store.status["checkpoints"]
    (create,) = creates(store.decide(gone(2)))
    assert create.resume == 20, "the step saved anew is the next attempt's to resume from"


def test_a_restore_that_found_no_recorded_step_valid_marks_every_one_it_tried_bad() -> None:
    store = Store()
    preempted_after_checkpoints(store, 10, 20, 30)
    store.decide(gone(1))
    store.decide(running(2))
    store.status["runtime"] = {
        "attempt": 2,
        "step": 0,
        "restoreError": "CheckpointCorrupt: no recorded checkpoint verifies",
        "badCheckpoints": [{"step": 30, "problem": "a"}, {"step": 20, "problem": "b"}, {"step": 10, "problem": "c"}],
    }
    store.decide(running(2))
    assert store.status["reason"] == "FailedRestore" and store.status["checkpoints"]["bad"] == [10, 20, 30]
    store.now += datetime.timedelta(minutes=1)
    store.decide(gone(2))
    assert store.phase == "Failed" and store.status["reason"] == "NoRestorableCheckpoint"
