"""The decision core, driven through whole journeys against an in-memory status (the API server's role).

Each step feeds an observation and the clock to `decide`, applies the returned merge patch to the stored
status exactly as the API server would, and checks the phase, the actions and the recorded history.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import pathlib
import re
from typing import Any

import pytest
import yaml

from trainingrun_operator.core import decision, model, patching
from trainingrun_operator.core.decision import CreateAttempt, DeleteRayJob, EnsureIdentity, Event
from trainingrun_operator.core.observation import AttemptObservation, PodObservation, RayJobObservation
from trainingrun_runtime import timestamps

EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / "manifests" / "examples" / "tiny.yaml"
T0 = datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC)


def spec_doc(**overrides: Any) -> dict[str, Any]:
    doc = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text())["spec"])
    doc["restartPolicy"] = {"failureBudget": 3, "backoff": {"initialSeconds": 10, "maxSeconds": 40, "factor": 2}}
    doc.update(overrides)
    return doc


class Store:
    """A TrainingRun's status as the API server keeps it, plus the clock."""

    def __init__(self, spec: dict[str, Any] | None = None) -> None:
        self.spec = model.TrainingRunSpec.model_validate(spec or spec_doc())
        self.status: dict[str, Any] = {}
        self.now = T0
        self.generation = 1

    def decide(self, observed: AttemptObservation | None = None, *, problem: str | None = None) -> decision.Decision:
        """One pass; with `problem`, a pass over an object that did not parse (no spec, as the reconciler sends)."""
        result = decision.decide(
            decision.Inputs(
                run="tiny",
                namespace="ns",
                generation=self.generation,
                spec=None if problem else self.spec,
                status=model.TrainingRunStatus.model_validate(self.status),
                observed=observed,
                now=self.now,
                problem=problem,
            )
        )
        assert "runtime" not in result.patch, "the operator never writes the driver's field"
        self.status = patching.apply(self.status, result.patch)
        return result

    def report(self, attempt: int, step: int, *, ckpt_attempt: int | None = None, **extra: Any) -> None:
        """The driver's merge patch into status.runtime after a checkpoint's rename."""
        self.status["runtime"] = {
            "attempt": attempt,
            "step": step,
            "updated": "2025-01-01T00:00:00Z",
            "finished": False,
            "lastCheckpoint": {
                "step": step,
                "path": f"/checkpoints/tiny/step_{step}",
                "attempt": ckpt_attempt or attempt,
                "time": "2025-01-01T00:00:00Z",
            },
            **extra,
        }

    @property
    def phase(self) -> str:
        return str(self.status.get("phase", "Pending"))

    def attempt(self) -> int:
        return int(self.status["attempt"]["number"])


def running(n: int) -> AttemptObservation:
    return AttemptObservation(
        number=n,
        rayjob=RayJobObservation(name=f"tiny-a{n}", deployment_status="Running", job_status="RUNNING"),
        pods=(PodObservation(name=f"tiny-a{n}-head", node_type="head", phase="Running", node_ready=True),),
    )


def preempted(n: int) -> AttemptObservation:
    return AttemptObservation(
        number=n,
        rayjob=RayJobObservation(name=f"tiny-a{n}", deployment_status="Running", job_status="RUNNING"),
        pods=(
            PodObservation(
                name=f"tiny-a{n}-head", node_type="head", phase="Running", disruption="PreemptionByScheduler"
            ),
        ),
    )


def failed(n: int, code: int = 1) -> AttemptObservation:
    return AttemptObservation(
        number=n,
        rayjob=RayJobObservation(
            name=f"tiny-a{n}",
            deployment_status="Failed",
            job_status="FAILED",
            reason="AppFailed",
            message=f"Job entrypoint command failed with exit code {code}",
        ),
    )


def deleting(n: int, pods: int = 1) -> AttemptObservation:
    """The ended attempt's RayJob is being deleted and `pods` of its pods still exist."""
    return AttemptObservation(
        number=n,
        rayjob=RayJobObservation(name=f"tiny-a{n}", deleting=True),
        pods=tuple(PodObservation(name=f"p{i}", node_type="worker", deleting=True) for i in range(pods)),
    )


def gone(n: int) -> AttemptObservation:
    return AttemptObservation(number=n)


def creates(result: decision.Decision) -> list[CreateAttempt]:
    return [a for a in result.actions if isinstance(a, CreateAttempt)]


def start_and_run(store: Store) -> None:
    n = store.attempt() + 1 if store.status.get("attempt") else 1
    store.decide(gone(n - 1) if n > 1 else None)
    assert store.phase == "Starting"
    store.decide(running(n))
    assert store.phase == "Running"


# ------------------------------------------------------------------------------------------- journeys


def test_a_new_run_writes_its_identities_and_creates_attempt_one_resuming_from_latest() -> None:
    store = Store()
    result = store.decide()
    assert result.phase.value == "Starting"
    assert result.patch["attempt"] == {
        "number": 1,
        "rayJobName": "tiny-a1",
        "start": "2025-01-01T00:00:00Z",
        "workersLost": 0,
    }
    assert result.patch["identity"] == {
        "serviceAccountName": "tiny-driver",
        "roleName": "tiny-driver",
        "roleBindingName": "tiny-driver",
    }
    assert [a for a in result.actions if not isinstance(a, Event)] == [
        EnsureIdentity("tiny-driver"),
        CreateAttempt(1, "tiny-a1", None),
    ]
    assert any(isinstance(a, Event) and a.reason == "AttemptStarted" for a in result.actions)


def test_the_first_attempt_resumes_from_a_pinned_step() -> None:
    store = Store(spec_doc(resume={"policy": "step", "step": 20}))
    assert creates(store.decide()) == [CreateAttempt(1, "tiny-a1", 20)]


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


def test_success_leads_to_succeeded_and_keeps_the_rayjob() -> None:
    store = Store()
    start_and_run(store)
    store.report(1, 40, finished=True)
    done = AttemptObservation(
        number=1, rayjob=RayJobObservation(name="tiny-a1", deployment_status="Complete", job_status="SUCCEEDED")
    )
    result = store.decide(done)
    assert store.phase == "Succeeded"
    assert not any(isinstance(a, DeleteRayJob) for a in result.actions)
    assert store.status["checkpoints"]["latest"]["step"] == 40
    assert {c["type"]: c["status"] for c in store.status["conditions"]} == {
        "Running": "False",
        "CheckpointAvailable": "True",
        "Succeeded": "True",
        "Failed": "False",
        "Suspended": "False",
    }
    assert store.status["completionTime"] == "2025-01-01T00:00:00Z"
    assert store.decide(done).patch == {}, "a finished run settles"


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


def test_the_next_attempt_is_told_the_older_recorded_steps_newest_first_and_never_the_bad_ones() -> None:
    store = Store()
    preempted_after_checkpoints(store, 10, 20, 30, 40)
    store.status["checkpoints"]["bad"] = [20]
    assert creates(store.decide(gone(1))) == [CreateAttempt(2, "tiny-a2", 40, (30, 10))]


def test_a_pinned_step_that_failed_verification_is_marked_bad_announced_once_and_the_attempt_trains_on() -> None:
    store = Store()
    preempted_after_checkpoints(store, 10, 20)
    store.decide(gone(1))
    store.decide(running(2))
    problem = "/checkpoints/tiny/step_20/policy/model.pt: sha256 mismatch (expected 3f.., got 9a..)"
    store.report(2, 11, ckpt_attempt=1, badCheckpoints=[{"step": 20, "problem": problem}])
    store.status["runtime"]["lastCheckpoint"]["step"] = 10  # the step the driver fell back to
    result = store.decide(running(2))
    assert store.phase == "Running"
    assert store.status["checkpoints"]["bad"] == [20]
    assert store.status["attempt"]["resumedFrom"] == 10
    assert store.status["restarts"]["failedRestore"] == 0 and store.status["restarts"]["total"] == 1
    warnings = [a for a in result.actions if isinstance(a, Event) and a.reason == "CheckpointCorrupt"]
    assert len(warnings) == 1 and "step 20" in warnings[0].message and problem in warnings[0].message
    again = store.decide(running(2))
    assert not [a for a in again.actions if isinstance(a, Event) and a.reason == "CheckpointCorrupt"]


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


def test_a_missing_rayjob_while_starting_is_created_again_under_the_same_name() -> None:
    store = Store()
    store.decide()
    result = store.decide(AttemptObservation(number=1))
    assert creates(result) == [CreateAttempt(1, "tiny-a1", None)]
    assert EnsureIdentity("tiny-driver") in result.actions, "after a crash the identity objects may be missing too"
    assert store.attempt() == 1 and store.phase == "Starting"


def test_rayjobs_of_other_attempts_are_deleted() -> None:
    store = Store()
    start_and_run(store)
    obs = AttemptObservation(number=1, rayjob=running(1).rayjob, pods=running(1).pods, other_rayjobs=("tiny-a0",))
    assert DeleteRayJob("tiny-a0") in store.decide(obs).actions


def test_suspend_stops_the_attempt_and_resume_starts_the_next_from_the_recorded_step() -> None:
    store = Store()
    start_and_run(store)
    store.report(1, 5)
    store.decide(running(1))
    store.spec = store.spec.model_copy(update={"suspend": True})
    result = store.decide(running(1))
    assert store.phase == "Suspended" and DeleteRayJob("tiny-a1") in result.actions
    assert store.status.get("restarts", {}).get("total", 0) == 0, "a suspension is not a restart"
    store.spec = store.spec.model_copy(update={"suspend": False})
    assert creates(store.decide(deleting(1))) == []
    assert creates(store.decide(gone(1))) == [CreateAttempt(2, "tiny-a2", 5)]


def test_an_invalid_trainer_fails_the_run_naming_the_field() -> None:
    doc = spec_doc()
    doc["trainer"]["grpo"]["lrr"] = 0.1
    store = Store(doc)
    result = store.decide()
    assert store.phase == "Failed" and store.status["reason"] == "InvalidSpec"
    assert "spec.trainer.grpo.lrr" in store.status["message"]
    assert creates(result) == []


def test_a_head_that_cannot_host_the_run_state_fails_the_run_before_any_rayjob_naming_the_field_and_fix() -> None:
    doc = spec_doc()
    doc["ray"]["head"]["rayStartParams"] = {"num-cpus": "2"}
    store = Store(doc)
    result = store.decide()
    assert store.phase == "Failed" and store.status["reason"] == "InvalidSpec"
    assert store.status["message"].startswith("spec.ray.head.rayStartParams.num-cpus: the head's Ray gets 2")
    assert 'num-cpus to "3" or more' in store.status["message"]
    assert creates(result) == []


UNPARSED = "spec.checkpoint.savePeriod: Input should be greater than or equal to 1"
FINISHED = AttemptObservation(
    number=1, rayjob=RayJobObservation(name="tiny-a1", deployment_status="Complete", job_status="SUCCEEDED")
)


def brought_to(phase: str) -> tuple[Store, AttemptObservation | None]:
    """A run that reached `phase` by an ordinary journey, and what the cluster shows of it now."""
    store = Store(spec_doc(restartPolicy={"failureBudget": 1}))
    if phase == "Pending":
        return store, None
    if phase == "Starting":
        store.decide()
        return store, AttemptObservation(number=1, rayjob=RayJobObservation(name="tiny-a1"))
    start_and_run(store)
    if phase == "Running":
        return store, running(1)
    if phase == "Restarting":
        store.decide(preempted(1))
        return store, deleting(1)
    if phase == "Suspended":
        store.spec = store.spec.model_copy(update={"suspend": True})
        store.decide(running(1))
        return store, gone(1)
    if phase == "Succeeded":
        store.report(1, 40, finished=True)
        store.decide(FINISHED)
        return store, FINISHED
    assert phase == "Failed"
    store.decide(failed(1))
    return store, failed(1)


@pytest.mark.parametrize(
    "before, after, reason, deleted",
    [
        ("Pending", "Failed", "InvalidSpec", []),
        ("Starting", "Failed", "InvalidSpec", ["tiny-a1"]),
        ("Running", "Failed", "InvalidSpec", ["tiny-a1"]),
        ("Restarting", "Failed", "InvalidSpec", []),  # its RayJob is already being deleted
        ("Suspended", "Failed", "InvalidSpec", []),
        ("Succeeded", "Succeeded", "Succeeded", []),  # a finished run keeps its verdict (no Succeeded -> Failed)
        ("Failed", "Failed", "BudgetExhausted", ["tiny-a1"]),  # a leftover RayJob goes, as on any pass
    ],
)
def test_an_object_that_does_not_parse_fails_the_run_unless_it_already_ended(
    before: str, after: str, reason: str, deleted: list[str]
) -> None:
    store, observed = brought_to(before)
    assert store.phase == before
    result = store.decide(observed, problem=UNPARSED)
    assert (store.phase, store.status["reason"]) == (after, reason)
    assert [a.name for a in result.actions if isinstance(a, DeleteRayJob)] == deleted
    warned = [(a.reason, a.message) for a in result.actions if isinstance(a, Event) and a.type == "Warning"]
    if before == after:
        assert result.patch == {} and warned == [], "an ended run is left as it is"
        return
    assert store.status["message"] == UNPARSED and warned == [("InvalidSpec", UNPARSED)]
    assert {c["type"]: c["status"] for c in store.status["conditions"]}["Failed"] == "True"
    assert not creates(result)
    if before in ("Starting", "Running"):
        assert store.status["attempts"][-1]["reason"] == "InvalidSpec"


def test_an_object_that_still_does_not_parse_is_neither_written_nor_announced_again() -> None:
    store = Store()
    store.decide(problem=UNPARSED)
    again = store.decide(problem=UNPARSED)
    assert store.phase == "Failed" and again.patch == {} and again.actions == ()


def test_inputs_without_a_spec_must_say_why() -> None:
    with pytest.raises(ValueError, match="no spec"):
        decision.Inputs(
            run="tiny", namespace="ns", generation=1, spec=None, status=model.TrainingRunStatus(), observed=None, now=T0
        )


def test_conditions_carry_the_generation_and_keep_their_transition_time() -> None:
    store = Store()
    start_and_run(store)
    first = {c["type"]: c for c in store.status["conditions"]}["Running"]
    store.now += datetime.timedelta(minutes=1)
    store.generation = 2
    store.decide(running(1))
    again = {c["type"]: c for c in store.status["conditions"]}["Running"]
    assert again["lastTransitionTime"] == first["lastTransitionTime"]
    assert again["observedGeneration"] == 2 and store.status["observedGeneration"] == 2


def test_status_times_are_written_to_the_second_and_the_next_attempts_time_to_the_millisecond() -> None:
    store = Store()
    store.now = T0 + datetime.timedelta(seconds=1, microseconds=987654)
    start_and_run(store)
    store.decide(failed(1))
    assert store.status["attempt"]["start"] == "2025-01-01T00:00:01Z", "truncated, as the API server writes times"
    assert {c["lastTransitionTime"] for c in store.status["conditions"]} == {"2025-01-01T00:00:01Z"}
    assert store.status["nextAttemptTime"] == "2025-01-01T00:00:11.987Z"  # tiny's backoff here: 10 s


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
    }


# ------------------------------------------------------------------------------------------ lost workers


def worker(n: int, i: int, **state: Any) -> PodObservation:
    healthy = {"phase": "Running", "node_name": "n2", "node_ready": True}
    return PodObservation(name=f"tiny-a{n}-worker-{i}", node_type="worker", **{**healthy, **state})


def with_pods(observed: AttemptObservation, *pods: PodObservation, departed: tuple[PodObservation, ...] = ()) -> Any:
    return AttemptObservation(
        number=observed.number, rayjob=observed.rayjob, pods=(*observed.pods, *pods), departed=departed
    )


def worker_lost_events(result: decision.Decision) -> list[str]:
    return [a.message for a in result.actions if isinstance(a, Event) and a.reason == "WorkerLost"]


EVICTED = {"disruption": "EvictionByEvictionAPI", "deleting": True}
# One attempt's passes, in order: (what the pass sees of the workers: present, departed; count after; announced)
# "restart" marks a pass of a freshly started operator: its departures memory is empty.
LOSS_JOURNEY: list[tuple[str, tuple[PodObservation, ...], tuple[PodObservation, ...], int, list[str]]] = [
    ("both workers healthy", (worker(1, 0), worker(1, 1)), (), 0, []),
    ("worker 0 evicted", (worker(1, 0, **EVICTED), worker(1, 1)), (), 1, ["tiny-a1-worker-0"]),
    ("the same eviction seen again", (worker(1, 0, **EVICTED), worker(1, 1)), (), 1, []),
    ("worker 0 gone, remembered", (worker(1, 1),), (worker(1, 0, **EVICTED),), 1, []),
    ("restart: worker 0 gone and forgotten", (worker(1, 1),), (), 1, []),
    ("restart: worker 0 still Terminating, condition gone", (worker(1, 0, deleting=True), worker(1, 1)), (), 1, []),
    ("KubeRay's replacement runs", (worker(1, 1), worker(1, 2)), (), 1, []),
    (
        "worker 1 preempted, worker 2 deleted",
        (worker(1, 1, disruption="PreemptionByScheduler"), worker(1, 2, deleting=True)),
        (),
        3,
        ["tiny-a1-worker-1", "tiny-a1-worker-2"],
    ),
    ("a worker's node NotReady", (worker(1, 3, node_ready=False),), (), 3, []),
    ("a worker's node gone", (worker(1, 3, node_ready=None, node_gone=True),), (), 4, ["tiny-a1-worker-3"]),
]


def test_each_lost_worker_pod_is_counted_and_announced_once_and_the_attempt_goes_on() -> None:
    store = Store()
    start_and_run(store)
    for case, pods, departed, count, announced in LOSS_JOURNEY:
        result = store.decide(with_pods(running(1), *pods, departed=departed))
        assert store.phase == "Running" and store.attempt() == 1, case
        assert store.status["attempt"]["workersLost"] == count, case
        events = worker_lost_events(result)
        assert len(events) == len(announced), (case, events)
        for message, pod in zip(events, announced, strict=True):
            assert f"worker pod {pod} lost (" in message and message.startswith("attempt 1: "), message
        if not announced:
            assert "attempt" not in result.patch, f"{case}: nothing new, nothing written"
        assert not any(isinstance(a, DeleteRayJob) for a in result.actions), case
    assert store.status["attempt"]["lostWorkerPods"] == [f"tiny-a1-worker-{i}" for i in range(4)]


def test_the_warning_names_the_pod_and_the_cause() -> None:
    store = Store()
    start_and_run(store)
    result = store.decide(with_pods(running(1), worker(1, 0, **EVICTED)))
    (event,) = [a for a in result.actions if isinstance(a, Event) and a.reason == "WorkerLost"]
    assert event.type == "Warning"
    assert event.message == (
        "attempt 1: worker pod tiny-a1-worker-0 lost (DisruptionTarget: EvictionByEvictionAPI); 1 lost in this attempt"
    )


def test_an_operator_restart_with_the_pod_still_evicted_counts_nothing_twice() -> None:
    store = Store()
    start_and_run(store)
    evicted = with_pods(running(1), worker(1, 0, **EVICTED))
    store.decide(evicted)
    saved = copy.deepcopy(store.status)  # what the API server keeps across the operator's restart
    restarted = Store()
    restarted.status = saved
    result = restarted.decide(evicted)
    assert worker_lost_events(result) == [] and result.patch == {}
    assert restarted.status["attempt"]["workersLost"] == 1


def test_the_names_kept_are_bounded_and_the_count_goes_on() -> None:
    store = Store()
    start_and_run(store)
    total = decision.MAX_LOST_WORKER_PODS + 5
    for i in range(total):
        store.decide(with_pods(running(1), worker(1, i, **EVICTED)))
    attempt = store.status["attempt"]
    assert attempt["workersLost"] == total
    assert len(attempt["lostWorkerPods"]) == decision.MAX_LOST_WORKER_PODS
    assert attempt["lostWorkerPods"][-1] == f"tiny-a1-worker-{total - 1}"


def test_the_history_entry_keeps_the_count_and_the_next_attempt_starts_from_zero() -> None:
    store = Store()
    start_and_run(store)
    store.report(1, 10)
    store.decide(with_pods(running(1), worker(1, 0, **EVICTED)))
    # The head goes in the same pass as a second worker: both counted before the attempt ends.
    lost_head = with_pods(preempted(1), worker(1, 1, disruption="PreemptionByScheduler"))
    result = store.decide(lost_head)
    assert store.phase == "Restarting" and store.status["reason"] == "Preempted"
    assert len(worker_lost_events(result)) == 1
    (entry,) = store.status["attempts"]
    assert entry["workersLost"] == 2 and "lostWorkerPods" not in entry, "the names stay out of the history"
    assert store.status["attempt"]["lostWorkerPods"] == ["tiny-a1-worker-0", "tiny-a1-worker-1"]
    store.decide(gone(1))
    assert store.status["attempt"] == {
        "number": 2,
        "rayJobName": "tiny-a2",
        "start": "2025-01-01T00:00:00Z",
        "resumedFrom": 10,
        "workersLost": 0,
    }


def test_workers_deleted_by_the_clusters_own_teardown_after_success_are_not_lost() -> None:
    store = Store()
    start_and_run(store)
    store.report(1, 40, finished=True)
    done = AttemptObservation(
        number=1,
        rayjob=RayJobObservation(name="tiny-a1", deployment_status="Complete", job_status="SUCCEEDED"),
        pods=(worker(1, 0, deleting=True),),
    )
    result = store.decide(done)
    assert store.phase == "Succeeded" and worker_lost_events(result) == []
    assert store.status["attempts"][0]["workersLost"] == 0


def test_a_driver_that_fails_after_a_worker_loss_is_preempted_naming_the_worker() -> None:
    store = Store()
    start_and_run(store)
    store.decide(with_pods(running(1), worker(1, 0, **EVICTED)))
    store.decide(failed(1, code=1))
    assert store.phase == "Restarting" and store.status["reason"] == "Preempted"
    (entry,) = store.status["attempts"]
    assert entry["reason"] == "Preempted" and "after worker pod tiny-a1-worker-0 was lost" in entry["message"]
    assert store.status["restarts"]["preempted"] == 1 and store.status["restarts"]["applicationFailure"] == 0
    assert store.status.get("consecutiveFailures", 0) == 0


def test_a_driver_that_fails_without_a_worker_loss_is_still_an_application_failure() -> None:
    store = Store()
    start_and_run(store)
    store.decide(with_pods(running(1), worker(1, 0)))
    store.decide(failed(1, code=1))
    assert store.status["reason"] == "ApplicationFailure" and store.status["restarts"]["applicationFailure"] == 1


def test_no_generation_worker_back_in_time_is_preempted_and_the_next_attempt_resumes_from_the_recorded_step() -> None:
    store = Store()
    start_and_run(store)
    store.report(1, 20)
    store.decide(running(1))
    store.decide(failed(1, code=4))
    assert store.phase == "Restarting" and store.status["reason"] == "Preempted"
    assert "workerReplacementSeconds" in store.status["attempts"][0]["message"]
    assert store.status["restarts"]["preempted"] == 1 and store.status.get("consecutiveFailures", 0) == 0
    store.now += datetime.timedelta(seconds=10)
    assert creates(store.decide(gone(1))) == [CreateAttempt(2, "tiny-a2", 20)]


# ----------------------------------------------------------------------------- a head's NotReady node


def head_not_ready(n: int, since: datetime.datetime, **state: Any) -> AttemptObservation:
    observed = running(n)
    head = dataclasses.replace(observed.pods[0], node_name="n1", node_ready=False, node_ready_changed=since, **state)
    return AttemptObservation(number=n, rayjob=observed.rayjob, pods=(head, worker(n, 0)))


def progress(store: Store) -> None:
    """The driver reports a finished step now (status.runtime.updated)."""
    store.status["runtime"] = {"attempt": store.attempt(), "step": 3, "updated": timestamps.rfc3339(store.now)}


def test_a_head_whose_node_stopped_reporting_keeps_the_attempt_while_the_driver_reports_until_the_grace_ends() -> None:
    store = Store(spec_doc(restartPolicy={"nodeNotReadySeconds": 60}))
    start_and_run(store)
    since = store.now
    for elapsed, expected_wait in ((1, 59), (30, 30), (59, 1)):
        store.now = since + datetime.timedelta(seconds=elapsed)
        progress(store)
        result = store.decide(head_not_ready(1, since))
        assert store.phase == "Running", elapsed
        assert result.requeue_after == pytest.approx(expected_wait), "looks again when the grace ends"
        assert not any(isinstance(a, DeleteRayJob) for a in result.actions)
    store.now = since + datetime.timedelta(seconds=60)
    progress(store)
    result = store.decide(head_not_ready(1, since))
    assert store.phase == "Restarting" and store.status["reason"] == "Preempted"
    assert "for 60s (spec.restartPolicy.nodeNotReadySeconds: 60)" in store.status["attempts"][0]["message"]
    assert DeleteRayJob("tiny-a1") in result.actions


def test_a_head_whose_node_stopped_reporting_ends_the_attempt_once_the_driver_is_silent_longer_than_the_grace() -> None:
    store = Store(spec_doc(restartPolicy={"nodeNotReadySeconds": 60}))
    start_and_run(store)
    progress(store)  # the last report, then silence
    store.now += datetime.timedelta(seconds=50)
    since = store.now
    result = store.decide(head_not_ready(1, since))
    assert store.phase == "Running" and result.requeue_after == pytest.approx(10), "the report's grace ends first"
    store.now += datetime.timedelta(seconds=11)
    store.decide(head_not_ready(1, since))
    assert store.phase == "Restarting" and store.status["reason"] == "Preempted"
    assert "has not reported progress for 61s" in store.status["attempts"][0]["message"]


def test_a_head_being_deleted_on_a_not_ready_node_ends_the_attempt_at_once_as_preempted() -> None:
    store = Store()
    start_and_run(store)
    progress(store)
    store.decide(head_not_ready(1, store.now, deleting=True))
    assert store.phase == "Restarting" and store.status["reason"] == "Preempted"


def evicted_in_grace(n: int, grace_ends: datetime.datetime) -> AttemptObservation:
    """The head pod evicted through the Eviction API, its preStop hook running until `grace_ends`."""
    head = PodObservation(
        name=f"tiny-a{n}-head",
        node_type="head",
        phase="Running",
        node_ready=True,
        disruption="EvictionByEvictionAPI",
        deleting=True,
        deletion_deadline=grace_ends,
    )
    job = RayJobObservation(name=f"tiny-a{n}", deployment_status="Running", job_status="RUNNING")
    return AttemptObservation(number=n, rayjob=job, pods=(head,))


def test_a_checkpoint_saved_on_the_heads_notice_is_recorded_and_the_attempt_loses_no_step() -> None:
    store = Store()
    start_and_run(store)
    store.report(1, 10)
    store.decide(running(1))
    store.status["runtime"]["step"] = 13  # a progress report: three steps past the recorded checkpoint
    grace_ends = store.now + datetime.timedelta(seconds=30)
    result = store.decide(evicted_in_grace(1, grace_ends))
    assert store.phase == "Running" and result.requeue_after is not None and result.requeue_after <= 35
    store.report(1, 13)
    store.status["runtime"]["lastCheckpoint"]["reason"] = "PreemptionNotice"
    result = store.decide(evicted_in_grace(1, grace_ends))
    assert any(isinstance(a, Event) and a.reason == "PreemptionNotice" for a in result.actions)
    assert store.status["checkpoints"]["latest"]["reason"] == "PreemptionNotice"
    store.decide(preempted(1))  # the hook answered; the driver stopped; the pod goes
    assert store.phase == "Restarting"
    assert store.status["attempts"][-1]["reason"] == "Preempted"
    assert store.status["attempts"][-1]["stepsLost"] == 0
    store.now += datetime.timedelta(seconds=60)
    (create,) = creates(store.decide(gone(1)))
    assert create.resume == 13


# ------------------------------------------------------------------------------------------ stalls


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


# ------------------------------------------------------------------------------------ what kubectl shows


def test_a_pass_that_learns_a_new_step_writes_only_the_progress_fields_and_one_that_learns_nothing_writes_nothing() -> (
    None
):
    store = Store()
    start_and_run(store)
    store.report(1, 10)
    store.decide(running(1))
    assert (store.status["progress"], store.status["rate"]["step"]) == ("10/120", 10)
    store.status["runtime"].update(step=25, reward=0.4567, updated="2025-01-01T00:00:30Z")
    store.now += datetime.timedelta(seconds=31)
    result = store.decide(running(1))
    assert result.patch == {
        "progress": "25/120",
        "reward": 0.457,
        "eta": "3m",
        "rate": {"step": 25, "time": "2025-01-01T00:00:30Z", "stepsPerSecond": 0.5},
    }
    store.now += datetime.timedelta(seconds=40)
    assert store.decide(running(1)).patch == {}


def test_the_attempt_table_follows_the_attempts_through_a_preemption() -> None:
    store = Store()
    start_and_run(store)
    assert [line.split()[0] for line in store.status["attemptTable"]] == ["ATTEMPT", "1"]
    store.report(1, 10)
    store.decide(running(1))
    store.now += datetime.timedelta(minutes=2)
    store.decide(preempted(1))
    assert store.status["attemptTable"][1].split()[2:5] == ["2m00s", "fresh", "Preempted"]
    store.decide(gone(1))
    assert [line.split()[:2] for line in store.status["attemptTable"][1:]] == [
        ["1", "2025-01-01T00:00:00Z"],
        ["2", "2025-01-01T00:02:00Z"],
    ]
