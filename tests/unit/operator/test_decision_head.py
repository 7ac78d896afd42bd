"""The decision core when the head pod is in trouble but still there: its node NotReady (the attempt is kept
while the driver reports, until the grace ends) or its eviction notice (the checkpoint saved on it is recorded).

Journeys against an in-memory status (`support.decisions.Store`).
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import pytest

from support.decisions import Store, creates, gone, preempted, running, spec_doc, start_and_run, worker
from trainingrun_operator.core.decision import DeleteRayJob, Event
from trainingrun_operator.core.observation import AttemptObservation, PodObservation, RayJobObservation
from trainingrun_runtime import timestamps


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
