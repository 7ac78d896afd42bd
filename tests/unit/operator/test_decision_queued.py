"""The decision core for a run queued by Kueue (`queueing.py`): its attempts wait in phase Queued until Kueue admits
them, nothing runs or is charged meanwhile, and an admitted attempt that is suspended again is a preemption.

Each step feeds an observation and the clock to `decide` with the run's queue (what the reconciler reads from the
run's labels), applies the returned merge patch to the stored status as the API server would, and checks the
phase, the conditions, the actions and the budget.
"""

from __future__ import annotations

import copy
import datetime
import pathlib
from typing import Any

import pytest
import yaml

from trainingrun_operator.core import decision, model, patching, queueing
from trainingrun_operator.core.decision import CreateAttempt, DeleteRayJob, Event
from trainingrun_operator.core.observation import AttemptObservation, PodObservation, RayJobObservation

EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / "manifests" / "examples" / "tiny.yaml"
T0 = datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC)
QUEUE = queueing.Queue("team-a", "high")


def spec_doc(**overrides: Any) -> dict[str, Any]:
    doc = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text())["spec"])
    doc["restartPolicy"] = {
        "failureBudget": 3,
        "preemptionBudget": 5,
        "backoff": {"initialSeconds": 10, "maxSeconds": 40, "factor": 2},
        "progressDeadlineSeconds": 60,
        "startupDeadlineSeconds": 30,
    }
    doc.update(overrides)
    return doc


class Store:
    """A TrainingRun's status as the API server keeps it, the clock, and the queue its labels name."""

    def __init__(self, spec: dict[str, Any] | None = None, queue: queueing.Queue | None = QUEUE) -> None:
        self.spec = model.TrainingRunSpec.model_validate(spec or spec_doc())
        self.status: dict[str, Any] = {}
        self.now = T0
        self.queue = queue

    def decide(self, observed: AttemptObservation | None = None) -> decision.Decision:
        result = decision.decide(
            decision.Inputs(
                run="tiny",
                namespace="ns",
                generation=1,
                spec=self.spec,
                status=model.TrainingRunStatus.model_validate(self.status),
                observed=observed,
                now=self.now,
                queue=self.queue,
            )
        )
        self.status = patching.apply(self.status, result.patch)
        return result

    def later(self, seconds: float) -> None:
        self.now += datetime.timedelta(seconds=seconds)

    @property
    def phase(self) -> str:
        return str(self.status.get("phase", "Pending"))

    def condition(self, kind: str) -> dict[str, Any]:
        return next(c for c in self.status["conditions"] if c["type"] == kind)


def waiting(n: int, deployment: str = "Suspended") -> AttemptObservation:
    """The attempt's RayJob, suspended: Kueue has not admitted it (KubeRay says Suspended, or nothing yet)."""
    return AttemptObservation(
        number=n, rayjob=RayJobObservation(name=f"tiny-a{n}", deployment_status=deployment, suspend=True)
    )


def admitted(n: int, deployment: str = "Suspended") -> AttemptObservation:
    """Kueue unsuspended the RayJob; KubeRay's status may still say Suspended until it reconciles."""
    return AttemptObservation(number=n, rayjob=RayJobObservation(name=f"tiny-a{n}", deployment_status=deployment))


def running(n: int, *, suspend: bool = False) -> AttemptObservation:
    return AttemptObservation(
        number=n,
        rayjob=RayJobObservation(name=f"tiny-a{n}", deployment_status="Running", job_status="RUNNING", suspend=suspend),
        pods=(PodObservation(name=f"tiny-a{n}-head", node_type="head", phase="Running", node_ready=True),),
    )


def events(result: decision.Decision) -> list[str]:
    return [a.reason for a in result.actions if isinstance(a, Event)]


def creates(result: decision.Decision) -> list[CreateAttempt]:
    return [a for a in result.actions if isinstance(a, CreateAttempt)]


def no_charge(status: dict[str, Any]) -> bool:
    restarts = status.get("restarts") or {}
    return not restarts.get("total") and not status.get("consecutiveFailures")


# ------------------------------------------------------------------------------------------- waiting


def test_a_queued_run_creates_its_first_attempt_in_the_queue_and_says_so() -> None:
    store = Store()
    result = store.decide()
    assert store.phase == "Queued"
    assert creates(result) == [CreateAttempt(1, "tiny-a1", None, (), QUEUE)]
    assert store.status["reason"] == "Queued"
    assert "LocalQueue team-a" in store.status["message"] and "priority class high" in store.status["message"]
    queued = store.condition("Queued")
    assert queued["status"] == "True" and "LocalQueue team-a" in queued["message"]
    assert store.condition("Running")["status"] == "False"
    assert events(result) == ["AttemptStarted", "Queued"]
    assert store.status["attemptTable"][1].split()[2] == "queued", "kubectl describe says it waits, not runs"


def test_a_run_without_a_queue_has_no_queued_condition_and_starts_at_once() -> None:
    store = Store(queue=None)
    result = store.decide()
    assert store.phase == "Starting"
    assert creates(result) == [CreateAttempt(1, "tiny-a1", None)]
    assert "Queued" not in {c["type"] for c in store.status["conditions"]}


def test_a_long_wait_in_the_queue_charges_nothing_and_sets_no_deadline() -> None:
    store = Store()
    store.decide()
    for deployment in ("", "New", "Suspended"):
        store.later(3600)  # far past the startup and progress deadlines
        result = store.decide(waiting(1, deployment))
        assert store.phase == "Queued"
        assert result.actions == (), "nothing to do but wait (no event again, no RayJob created again)"
        assert result.requeue_after is None, "the RayJob's admission wakes the run, no timer"
    assert no_charge(store.status)
    assert "end" not in store.status["attempt"]


def test_kuberays_own_walk_of_a_suspended_rayjob_keeps_the_run_queued_and_its_walk_after_admission_starts_it() -> None:
    """KubeRay 1.5 takes a RayJob created suspended through Initializing and Suspending to Suspended (the cluster it
    never made, deleted); once unsuspended, from Suspended through New and Initializing to Running."""
    store = Store()
    store.decide()
    for deployment in ("", "Initializing", "Suspending", "Suspended"):
        store.decide(waiting(1, deployment))
        assert store.phase == "Queued", deployment
    for deployment in ("Suspended", "", "Initializing"):
        store.decide(admitted(1, deployment))
        assert store.phase == "Starting", deployment
    store.decide(running(1))
    assert store.phase == "Running" and no_charge(store.status)


def test_a_queued_attempts_missing_rayjob_is_created_again_in_the_queue() -> None:
    store = Store()
    store.decide()
    result = store.decide(AttemptObservation(number=1))
    assert store.phase == "Queued"
    assert creates(result) == [CreateAttempt(1, "tiny-a1", None, (), QUEUE)]


def test_admission_moves_the_run_to_starting_and_records_when() -> None:
    store = Store()
    store.decide()
    store.later(90)
    result = store.decide(admitted(1))
    assert store.phase == "Starting", "KubeRay's stale Suspended right after admission is no preemption"
    assert store.status["attempt"]["admitted"] == "2025-01-01T00:01:30Z"
    assert "Admitted" in events(result)
    assert any("after 90s in the queue" in a.message for a in result.actions if isinstance(a, Event))
    assert store.condition("Queued")["status"] == "False"
    assert no_charge(store.status)
    assert store.status["attemptTable"][1].split()[2] == "running"


def test_an_attempt_admitted_and_already_running_goes_straight_to_running() -> None:
    store = Store()
    store.decide()
    store.later(5)
    store.decide(running(1))
    assert store.phase == "Running"
    assert store.status["attempt"]["admitted"] == store.status["attempt"]["runningSince"]


def test_the_startup_deadline_counts_from_running_not_from_the_wait_in_the_queue() -> None:
    store = Store()
    store.decide()
    store.later(3600)
    store.decide(admitted(1, "Initializing"))
    store.later(3600)  # a slow start is not the watchdog's business either: it watches Running attempts
    store.decide(admitted(1, "Initializing"))
    assert store.phase == "Starting"
    result = store.decide(running(1))
    assert store.phase == "Running"
    assert result.requeue_after == pytest.approx(30), "startupDeadlineSeconds from runningSince"


# ------------------------------------------------------------------------------------------ preemption


def test_an_admitted_attempt_suspended_again_before_it_runs_is_a_preemption() -> None:
    store = Store()
    store.decide()
    store.decide(admitted(1, "Initializing"))
    result = store.decide(
        AttemptObservation(
            number=1, rayjob=RayJobObservation(name="tiny-a1", deployment_status="Initializing", suspend=True)
        )
    )
    assert store.phase == "Restarting" and store.status["reason"] == "Preempted"
    assert "after it was admitted" in store.status["attempts"][0]["message"]
    assert DeleteRayJob("tiny-a1") in result.actions
    assert store.status["restarts"]["preempted"] == 1 and store.status["restarts"]["total"] == 1


def test_a_running_attempt_suspended_by_kueue_is_a_preemption_and_the_next_attempt_queues_again() -> None:
    store = Store()
    store.decide()
    store.decide(running(1))
    store.decide(running(1, suspend=True))
    assert store.phase == "Restarting" and store.status["reason"] == "Preempted"
    assert store.status.get("consecutiveFailures", 0) == 0, "a preemption is charged to the preemption budget"
    store.later(60)
    result = store.decide(AttemptObservation(number=1))
    assert store.phase == "Queued"
    assert creates(result) == [CreateAttempt(2, "tiny-a2", None, (), QUEUE)]
    assert "admitted" not in store.status["attempt"]


def test_suspending_a_queued_run_takes_its_attempt_out_of_the_queue() -> None:
    store = Store()
    store.decide()
    store.spec = store.spec.model_copy(update={"suspend": True})
    result = store.decide(waiting(1))
    assert store.phase == "Suspended"
    assert DeleteRayJob("tiny-a1") in result.actions
    assert store.status["attempts"][0]["reason"] == "Suspended"
    assert no_charge(store.status)
    store.spec = store.spec.model_copy(update={"suspend": False})
    result = store.decide(AttemptObservation(number=1))
    assert store.phase == "Queued" and creates(result) == [CreateAttempt(2, "tiny-a2", None, (), QUEUE)]


def test_a_verdict_on_a_queued_rayjob_ends_the_attempt() -> None:
    store = Store()
    store.decide()
    store.decide(
        AttemptObservation(
            number=1,
            rayjob=RayJobObservation(
                name="tiny-a1", deployment_status="ValidationFailed", reason="ValidationFailed", suspend=True
            ),
        )
    )
    assert store.phase == "Failed" and store.status["reason"] == "PermanentFailure"


# --------------------------------------------------------------------- a queue that suspends unlabelled jobs


def test_an_unlabelled_runs_rayjob_suspended_before_it_ever_ran_waits_as_queued() -> None:
    """Kueue with manageJobsWithoutQueueName suspends every new RayJob through its webhook: not a preemption."""
    store = Store(queue=None)
    store.decide()
    assert store.phase == "Starting"
    store.later(600)
    store.decide(waiting(1, ""))
    assert store.phase == "Queued"
    assert "has no kueue.x-k8s.io/queue-name label" in store.condition("Queued")["message"]
    assert no_charge(store.status)
    store.decide(admitted(1))
    assert store.phase == "Starting" and "admitted" in store.status["attempt"]
    store.decide(running(1))
    assert store.phase == "Running"


# -------------------------------------------------------------------------------------- Kueue's rules


@pytest.mark.parametrize(
    ("workers", "queue", "field"),
    [
        ([{"name": f"g{i}", "replicas": 1} for i in range(8)], QUEUE, "spec.ray.workers:"),
        ([{"name": "head", "replicas": 1}], QUEUE, "spec.ray.workers[0].name:"),
        ([], queueing.Queue("Team_A"), "metadata.labels[kueue.x-k8s.io/queue-name]:"),
        ([], queueing.Queue("team-a", "High!"), "metadata.labels[kueue.x-k8s.io/priority-class]:"),
    ],
    ids=["eight worker groups", "a worker group named head", "a bad queue name", "a bad priority class"],
)
def test_a_queued_run_that_breaks_kueues_rules_fails_naming_the_field(
    workers: list[dict[str, Any]], queue: queueing.Queue, field: str
) -> None:
    store = Store(spec_doc(ray={"head": {}, "workers": workers}), queue=queue)
    result = store.decide()
    assert store.phase == "Failed" and store.status["reason"] == "InvalidSpec"
    assert store.status["message"].startswith(field)
    assert creates(result) == []


def test_the_same_spec_without_a_queue_is_valid() -> None:
    store = Store(spec_doc(ray={"head": {}, "workers": [{"name": f"g{i}"} for i in range(8)]}), queue=None)
    store.decide()
    assert store.phase == "Starting"
