"""The decision core over a run's ordinary life: its first attempt (identities, the resume point), an attempt's
RayJob missing or left over, success, and suspend/resume.

Journeys against an in-memory status (`support.decisions.Store`: each pass's merge patch is applied as the API
server would).
"""

from __future__ import annotations

from support.decisions import Store, creates, deleting, gone, running, spec_doc, start_and_run
from trainingrun_operator.core.decision import CreateAttempt, DeleteRayJob, EnsureIdentity, Event
from trainingrun_operator.core.observation import AttemptObservation, RayJobObservation


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
