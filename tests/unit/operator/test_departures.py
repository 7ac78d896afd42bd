"""Departures: a disrupted pod that vanished before the reconcile still explains why its attempt ended."""

from __future__ import annotations

import datetime

from trainingrun_operator.core import decision, departures
from trainingrun_operator.core.classification import Context, FailureClass, classify
from trainingrun_operator.core.observation import AttemptObservation, PodObservation, RayJobObservation

RUNNING = Context(now=datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC), node_not_ready_seconds=60.0, running=True)
EVICTED_HEAD = PodObservation(name="h", node_type="head", deleting=True, disruption="EvictionByEvictionAPI")


def test_an_evicted_head_that_is_already_gone_is_classified_as_preempted() -> None:
    memory = departures.Departures()
    memory.record("ns", "run", "1", EVICTED_HEAD)
    obs = AttemptObservation(
        number=1,
        rayjob=RayJobObservation(name="run-a1", deployment_status="Running", job_status="RUNNING"),
        departed=memory.of_attempt("ns", "run", 1, present=set()),
    )
    outcome = classify(obs, RUNNING)
    assert outcome is not None and outcome.failure is FailureClass.PREEMPTED


def test_without_the_memory_the_same_loss_is_an_infrastructure_failure() -> None:
    obs = AttemptObservation(number=1, rayjob=RayJobObservation(name="run-a1", deployment_status="Running"))
    outcome = classify(obs, RUNNING)
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


def test_a_worker_seen_being_deleted_is_remembered_and_a_head_only_with_a_disruption_cause() -> None:
    memory = departures.Departures()
    deleted_worker = PodObservation(name="w", node_type="worker", deleting=True)
    memory.record("ns", "run", "1", deleted_worker)
    memory.record("ns", "run", "1", PodObservation(name="h", node_type="head", deleting=True))
    assert memory.of_attempt("ns", "run", 1, present=set()) == (deleted_worker,)


def test_the_status_keeps_more_lost_worker_names_than_the_memory_holds_pods() -> None:
    # A pod still remembered (departed) must still be named in lostWorkerPods, or a pass would count it again.
    assert decision.MAX_LOST_WORKER_PODS > departures.MAX_PER_RUN
