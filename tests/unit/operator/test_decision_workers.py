"""The decision core when an attempt loses worker pods: each lost pod counted and announced once (across
operator restarts too), the names kept bounded, the history entry, and a driver that fails after a loss.

Journeys against an in-memory status (`support.decisions.Store`).
"""

from __future__ import annotations

import copy
import datetime
from typing import Any

from support.decisions import Store, creates, failed, gone, preempted, running, start_and_run, worker
from trainingrun_operator.core import decision
from trainingrun_operator.core.decision import CreateAttempt, DeleteRayJob, Event
from trainingrun_operator.core.observation import AttemptObservation, PodObservation, RayJobObservation


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
