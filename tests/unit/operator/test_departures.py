"""Departures: a disrupted pod that vanished before the reconcile still explains why its attempt ended."""

from __future__ import annotations

from trainingrun_operator import departures
from trainingrun_operator.classification import FailureClass, classify
from trainingrun_operator.observation import AttemptObservation, PodObservation, RayJobObservation

EVICTED_HEAD = PodObservation(name="h", node_type="head", deleting=True, disruption="EvictionByEvictionAPI")


def test_an_evicted_head_that_is_already_gone_is_classified_as_preempted() -> None:
    memory = departures.Departures()
    memory.record("ns", "run", "1", EVICTED_HEAD)
    obs = AttemptObservation(
        number=1,
        rayjob=RayJobObservation(name="run-a1", deployment_status="Running", job_status="RUNNING"),
        departed=memory.of_attempt("ns", "run", 1, present=set()),
    )
    outcome = classify(obs, running=True, restore_error=None)
    assert outcome is not None and outcome.failure is FailureClass.PREEMPTED


def test_without_the_memory_the_same_loss_is_an_infrastructure_failure() -> None:
    obs = AttemptObservation(number=1, rayjob=RayJobObservation(name="run-a1", deployment_status="Running"))
    outcome = classify(obs, running=True, restore_error=None)
    assert outcome is not None and outcome.failure is FailureClass.INFRASTRUCTURE_FAILURE


def test_only_disrupted_pods_of_that_attempt_that_are_gone_are_returned() -> None:
    memory = departures.Departures()
    memory.record("ns", "run", "1", PodObservation(name="healthy", node_type="worker", phase="Running"))
    memory.record("ns", "run", "1", EVICTED_HEAD)
    memory.record("ns", "run", "2", PodObservation(name="w2", node_type="worker", reason="Evicted"))
    assert memory.of_attempt("ns", "run", 1, present=set()) == (EVICTED_HEAD,)
    assert memory.of_attempt("ns", "run", 1, present={"h"}) == ()
    memory.forget("ns", "run")
    assert memory.of_attempt("ns", "run", 2, present=set()) == ()


def test_memory_per_run_is_bounded() -> None:
    memory = departures.Departures()
    for i in range(departures.MAX_PER_RUN + 10):
        memory.record("ns", "run", "1", PodObservation(name=f"p{i}", node_type="worker", reason="Evicted"))
    assert len(memory.of_attempt("ns", "run", 1, present=set())) == departures.MAX_PER_RUN
