"""The decision core over a spec it cannot run: an invalid trainer or head fails the run before any RayJob,
naming the field; an object that does not parse fails the run from any phase but an ended one, once.

Journeys against an in-memory status (`support.decisions.Store`).
"""

from __future__ import annotations

import pytest

from support.decisions import T0, Store, creates, deleting, failed, gone, preempted, running, spec_doc, start_and_run
from trainingrun_operator.core import decision, model
from trainingrun_operator.core.decision import DeleteRayJob, Event
from trainingrun_operator.core.observation import AttemptObservation, RayJobObservation


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
