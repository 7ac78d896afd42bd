"""What the operator's metrics say about a run (figures.py), driven through the decision core's journeys: each pass's
status read and status written are tallied as the reconciler hands them to the exporter after the write."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import pathlib
from typing import Any

import pytest
import yaml

from trainingrun_operator.core import decision, figures, model, patching
from trainingrun_operator.core.figures import Memory, Tally
from trainingrun_operator.core.observation import AttemptObservation, PodObservation, RayJobObservation
from trainingrun_runtime import timestamps

EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / "manifests" / "examples" / "tiny.yaml"
T0 = datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC)
CREATED = "2024-12-31T23:59:58Z"  # the apply: two seconds before the first pass


class Journey:
    """A run's status as the API server keeps it, each pass tallied as the exporter would be told."""

    def __init__(self, **spec: Any) -> None:
        doc = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text())["spec"])
        doc["restartPolicy"] = {"failureBudget": 3, "backoff": {"initialSeconds": 10, "maxSeconds": 40, "factor": 2}}
        doc.update(spec)
        self.spec = model.TrainingRunSpec.model_validate(doc)
        self.status: dict[str, Any] = {}
        self.now = T0
        self.memory = Memory()
        self.tallies: list[Tally] = []
        self.statuses: list[model.TrainingRunStatus] = []

    def decide(self, observed: AttemptObservation | None = None) -> Tally:
        old = model.TrainingRunStatus.model_validate(self.status)
        result = decision.decide(
            decision.Inputs(
                run="tiny", namespace="ns", generation=1, spec=self.spec, status=old, observed=observed, now=self.now
            )
        )
        self.status = patching.apply(self.status, result.patch)
        self.memory, tally = figures.tally(self.memory, old, result.status, self.now, CREATED)
        self.tallies.append(tally)
        self.statuses.append(result.status)
        return tally

    def after(self, seconds: float) -> None:
        self.now += datetime.timedelta(seconds=seconds)

    def report(self, attempt: int, step: int, checkpoint: int | None = None, reason: str = "Periodic") -> None:
        """The driver's merge patch into status.runtime: a step, and the checkpoint it recorded last."""
        saved = step if checkpoint is None else checkpoint
        self.status["runtime"] = {
            "attempt": attempt,
            "step": step,
            "updated": timestamps.rfc3339(self.now),
            "lastCheckpoint": {
                "step": saved,
                "path": f"/checkpoints/tiny/step_{saved}",
                "attempt": attempt,
                "time": timestamps.rfc3339(self.now),
                "reason": reason,
            },
        }

    def total(self) -> Tally:
        """Every pass's counts summed; the durations of the last pass that had each."""
        ended = [t.ended for t in self.tallies if t.ended]
        assert len(ended) <= 1, f"several attempts ended: use ended() ({ended})"
        last = {
            f: next((getattr(t, f) for t in reversed(self.tallies) if getattr(t, f) is not None), None)
            for f in ("first_rayjob_seconds", "restart_seconds", "first_report_seconds")
        }
        return Tally(
            ended=ended[0] if ended else None,
            steps_lost=sum(t.steps_lost for t in self.tallies),
            workers_lost=sum(t.workers_lost for t in self.tallies),
            checkpoints_recorded=sum(t.checkpoints_recorded for t in self.tallies),
            **last,
        )

    def ended(self) -> list[str]:
        return [t.ended for t in self.tallies if t.ended]

    def durations(self, field: str) -> list[float]:
        return [getattr(t, field) for t in self.tallies if getattr(t, field) is not None]


def running(n: int, *workers: PodObservation) -> AttemptObservation:
    head = PodObservation(name=f"tiny-a{n}-head", node_type="head", phase="Running", node_ready=True)
    job = RayJobObservation(name=f"tiny-a{n}", deployment_status="Running", job_status="RUNNING")
    return AttemptObservation(number=n, rayjob=job, pods=(head, *workers))


def preempted(n: int) -> AttemptObservation:
    head = PodObservation(name=f"tiny-a{n}-head", node_type="head", phase="Running", disruption="PreemptionByScheduler")
    job = RayJobObservation(name=f"tiny-a{n}", deployment_status="Running", job_status="RUNNING")
    return AttemptObservation(number=n, rayjob=job, pods=(head,))


def failed(n: int) -> AttemptObservation:
    job = RayJobObservation(
        name=f"tiny-a{n}",
        deployment_status="Failed",
        job_status="FAILED",
        reason="AppFailed",
        message="Job entrypoint command failed with exit code 1",
    )
    return AttemptObservation(number=n, rayjob=job)


def succeeded(n: int) -> AttemptObservation:
    job = RayJobObservation(name=f"tiny-a{n}", deployment_status="Complete", job_status="SUCCEEDED")
    return AttemptObservation(number=n, rayjob=job)


def gone(n: int) -> AttemptObservation:
    return AttemptObservation(number=n)


def first_attempt_running(journey: Journey) -> None:
    journey.decide()
    journey.after(3)
    journey.decide(running(1))
    assert journey.status["phase"] == "Running"


# ------------------------------------------------------------------------------------------------ journeys


def test_a_preemption_counts_one_preempted_attempt_its_lost_steps_once_the_next_attempt_starts_and_the_durations() -> (
    None
):
    journey = Journey()
    journey.decide()
    assert journey.tallies[-1].first_rayjob_seconds == 2.0, "apply -> the decision that creates the first RayJob"
    journey.after(3)
    journey.decide(running(1))
    journey.after(5)
    journey.report(1, 10)
    assert journey.decide(running(1)).first_report_seconds == 8.0, "attempt start -> its driver's first report"
    journey.after(1)
    journey.report(1, 13, checkpoint=10)  # three steps past the checkpoint
    moved = journey.decide(running(1))
    assert moved.elapsed_seconds == 1.0, "a second of the run, between the two reports"
    assert dataclasses.replace(moved, elapsed_seconds=0.0) == Tally(), "a progress report changes no other count"

    at_end = journey.decide(preempted(1))
    assert journey.status["phase"] == "Restarting" and journey.status["attempt"]["stepsLost"] == 3
    assert at_end.ended == "Preempted" and at_end.steps_lost == 0, "a preempted attempt's loss may still shrink"
    journey.after(0.25)  # a preemption restarts without backoff: the next pass starts attempt 2
    started = journey.decide(gone(1))
    assert journey.status["attempt"]["number"] == 2
    assert started.steps_lost == 3, "counted once no notice checkpoint can shrink it"
    assert started.restart_seconds == 0.25, "exact: this process saw the failure"
    journey.after(4)
    journey.decide(running(2))
    journey.after(2)
    journey.report(2, 11)
    assert journey.decide(running(2)).first_report_seconds == 6.0
    assert journey.total() == Tally(
        ended="Preempted",
        steps_lost=3,
        checkpoints_recorded=2,  # step 10 by attempt 1, step 11 by attempt 2
        first_rayjob_seconds=2.0,
        restart_seconds=0.25,
        first_report_seconds=6.0,
    )


def test_a_checkpoint_saved_on_the_notice_and_read_after_the_attempt_ended_counts_no_lost_step() -> None:
    journey = Journey()
    first_attempt_running(journey)
    journey.report(1, 10)
    journey.decide(running(1))
    journey.report(1, 13, checkpoint=10)
    journey.decide(preempted(1))
    assert journey.status["attempt"]["stepsLost"] == 3
    journey.report(1, 13, reason="PreemptionNotice")  # the driver saved step 13 on the head's notice
    journey.decide(gone(1))
    assert journey.status["attempts"][0]["stepsLost"] == 0
    assert journey.status["attempt"]["number"] == 2
    assert journey.total().steps_lost == 0 and journey.total().checkpoints_recorded == 2


def test_an_application_failure_counts_its_lost_steps_when_it_ends_and_the_restart_includes_the_backoff() -> None:
    journey = Journey()
    first_attempt_running(journey)
    journey.report(1, 12, checkpoint=10)
    journey.decide(running(1))
    journey.after(1)
    ended = journey.decide(failed(1))
    assert ended.ended == "ApplicationFailure" and ended.steps_lost == 2
    journey.after(5)
    assert journey.decide(gone(1)).restart_seconds is None, "still in the 10 s backoff"
    journey.after(5)
    assert journey.decide(gone(1)).restart_seconds == 10.0
    assert journey.total().steps_lost == 2


def test_attempts_ended_are_counted_by_class_each_once() -> None:
    journey = Journey()
    first_attempt_running(journey)
    journey.decide(failed(1))
    journey.after(10)
    journey.decide(gone(1))
    journey.decide(running(2))
    journey.decide(preempted(2))
    journey.decide(preempted(2))  # the same pod seen again: the attempt already ended
    journey.decide(gone(2))
    journey.decide(running(3))
    journey.report(3, 20)
    journey.decide(succeeded(3))
    assert journey.status["phase"] == "Succeeded"
    assert journey.ended() == ["ApplicationFailure", "Preempted", "Succeeded"]
    assert set(journey.ended()) <= set(figures.CLASSES)


def test_a_succeeded_attempt_loses_no_step() -> None:
    journey = Journey()
    first_attempt_running(journey)
    journey.report(1, 20, checkpoint=18)
    journey.decide(succeeded(1))
    assert journey.status["attempt"]["stepsLost"] == 2, "the status says what the driver reached past its checkpoint"
    assert journey.total().steps_lost == 0 and journey.total().ended == "Succeeded"


def test_each_lost_worker_pod_is_counted_once() -> None:
    journey = Journey()
    first_attempt_running(journey)
    evicted = {"disruption": "EvictionByEvictionAPI", "deleting": True}
    w0 = PodObservation(name="tiny-a1-worker-0", node_type="worker", **evicted)
    w1 = PodObservation(name="tiny-a1-worker-1", node_type="worker", phase="Running", node_ready=True)
    assert journey.decide(running(1, w0, w1)).workers_lost == 1
    assert journey.decide(running(1, w0, w1)).workers_lost == 0, "the same eviction seen again"
    w1_lost = dataclasses.replace(w1, disruption="PreemptionByScheduler")
    assert journey.decide(running(1, w1_lost)).workers_lost == 1
    assert journey.total().workers_lost == 2 == journey.status["attempt"]["workersLost"]


def test_no_duration_spans_a_suspension() -> None:
    journey = Journey(suspend=True)
    journey.decide()
    assert journey.status["phase"] == "Suspended"
    journey.spec = journey.spec.model_copy(update={"suspend": False})
    journey.after(60)
    journey.decide()
    assert journey.status["phase"] == "Starting"
    assert journey.durations("first_rayjob_seconds") == [], "not apply -> RayJob: the run waited, suspended"
    journey.decide(running(1))
    journey.decide(preempted(1))
    journey.spec = journey.spec.model_copy(update={"suspend": True})
    journey.decide(gone(1))
    journey.spec = journey.spec.model_copy(update={"suspend": False})
    journey.after(60)
    journey.decide(gone(1))
    assert journey.status["attempt"]["number"] == 2
    assert journey.durations("restart_seconds") == [], "not failure -> RayJob: the run waited, suspended"


# ----------------------------------------------------------------------------------- counted on the transition


def journeys() -> list[Journey]:
    a, b = Journey(), Journey()
    for journey in (a, b):
        first_attempt_running(journey)
        journey.report(1, 12, checkpoint=10)
        journey.decide(running(1))
    a.decide(preempted(1))
    a.decide(gone(1))
    b.decide(failed(1))
    b.after(10)
    b.decide(gone(1))
    return [a, b]


@pytest.mark.parametrize("journey", journeys(), ids=["preemption", "failure"])
def test_a_pass_over_a_status_already_written_counts_nothing_even_after_an_operator_restart(journey: Journey) -> None:
    """The reconciler tallies what it read against what it wrote: a pass run again, or the first pass of a restarted
    operator (no memory), over a status that already says it, finds no difference."""
    assert any(t != Tally() for t in journey.tallies)
    for status in journey.statuses:
        for memory in (journey.memory, Memory()):
            assert figures.tally(memory, status, status, journey.now, CREATED)[1] == Tally()


def test_without_this_processs_memory_durations_are_counted_from_the_status_times_to_the_second() -> None:
    journey = Journey()
    first_attempt_running(journey)
    journey.after(0.7)
    journey.decide(preempted(1))  # ends at T0 + 3.7 s; the status says T0 + 3 s
    journey.memory = Memory()  # the operator restarted
    journey.after(0.5)
    assert journey.decide(gone(1)).restart_seconds == pytest.approx(1.2)  # T0 + 4.2 s, from T0 + 3 s
    journey.memory = Memory()
    journey.after(2)
    journey.report(2, 11)
    # The report at T0 + 6.2 s; the start (T0 + 4.2 s) written as T0 + 4 s.
    assert journey.decide(running(2)).first_report_seconds == pytest.approx(2.2)


def test_a_first_report_stamped_before_the_attempt_started_counts_until_the_pass_that_saw_it() -> None:
    journey = Journey()
    first_attempt_running(journey)
    journey.report(1, 1)
    journey.status["runtime"]["updated"] = "2024-01-01T00:00:00Z"  # the driver's clock is a year behind
    assert journey.decide(running(1)).first_report_seconds == 3.0


# -------------------------------------------------------------------------------------------------- gauges


def test_the_gauges_are_the_phase_attempt_newest_checkpoint_and_the_drivers_newest_step() -> None:
    assert figures.gauges(model.TrainingRunStatus()) == figures.Gauges("Pending", 0, None, None, None)
    journey = Journey()
    first_attempt_running(journey)
    journey.report(1, 13, checkpoint=10)
    journey.decide(running(1))
    gauges = figures.gauges(model.TrainingRunStatus.model_validate(journey.status))
    ratio = journey.status["goodput"]["ratio"]
    assert gauges == figures.Gauges("Running", 1, 10, T0 + datetime.timedelta(seconds=3), 13, ratio)


def test_the_classes_are_the_failure_classes_then_the_other_endings() -> None:
    assert figures.FAILURE_CLASSES == (
        "Preempted",
        "ApplicationFailure",
        "InfrastructureFailure",
        "FailedRestore",
        "Stalled",
    )
    assert figures.CLASSES[len(figures.FAILURE_CLASSES) :] == ("Succeeded", "Suspended", "InvalidSpec")
    assert figures.PHASES == (
        "Pending",
        "Queued",
        "Starting",
        "Running",
        "Restarting",
        "Suspended",
        "Succeeded",
        "Failed",
    )


def test_a_queued_attempts_first_report_is_counted_from_its_admission_not_its_wait_in_the_queue() -> None:
    old = model.TrainingRunStatus.model_validate(
        {
            "phase": "Running",
            "attempt": {"number": 1, "start": "2025-01-01T00:00:00Z", "admitted": "2025-01-01T00:10:00Z"},
        }
    )
    new = old.model_copy(
        update={
            "runtime": model.RuntimeReport(attempt=1, step=1, updated="2025-01-01T00:10:30Z"),
            "rate": model.ProgressRate(attempt=1, step=1, time="2025-01-01T00:10:30Z"),
        }
    )
    now = T0 + datetime.timedelta(minutes=11)
    assert figures.tally(Memory(started=(1, T0)), old, new, now)[1].first_report_seconds == 30.0


def test_the_goodput_counts_add_up_to_the_status_across_a_restart() -> None:
    journey = Journey()
    first_attempt_running(journey)
    journey.after(5)
    journey.report(1, 10)
    journey.decide(running(1))
    journey.after(30)
    journey.report(1, 40, checkpoint=40)
    journey.decide(running(1))
    journey.after(1)
    journey.decide(preempted(1))
    journey.after(1)
    journey.decide(gone(1))
    journey.after(10)
    journey.decide(running(2))
    journey.after(5)
    journey.report(2, 41)
    journey.decide(running(2))
    counted: dict[str, float] = {}
    for t in journey.tallies:
        for cause, seconds in t.lost_seconds:
            counted[cause] = counted.get(cause, 0.0) + seconds
    lost = journey.status["goodput"]["lostSeconds"]
    assert counted == pytest.approx({k: v for k, v in lost.items() if v > 0})
    assert counted["restart"] >= 16, "attempt 1's end to attempt 2's first step"
    elapsed = sum(t.elapsed_seconds for t in journey.tallies)
    assert elapsed == pytest.approx(journey.status["goodput"]["elapsedSeconds"])
