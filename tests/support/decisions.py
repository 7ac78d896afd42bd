"""The decision core driven through journeys against an in-memory status (the API server's role).

Each step feeds an observation and the clock to `decision.decide`, applies the returned merge patch to the stored
status exactly as the API server would, and leaves the test to check the phase, the actions and the recorded
history. Used by tests/unit/operator/test_decision_*.py: a run from manifests/examples/tiny.yaml, the observations
of its attempts (running, preempted, failed, being deleted, gone, a worker pod) and the passes that start one.
"""

from __future__ import annotations

import copy
import datetime
import pathlib
from typing import Any

import yaml

from trainingrun_operator.core import decision, model, patching
from trainingrun_operator.core.decision import CreateAttempt
from trainingrun_operator.core.observation import AttemptObservation, PodObservation, RayJobObservation

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "manifests" / "examples" / "tiny.yaml"
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


def failed(n: int, code: int = 1, *, logs: str | None = None) -> AttemptObservation:
    """KubeRay's verdict on a driver that exited with `code`, with the last lines of its log when `logs` is given."""
    message = f"Job entrypoint command failed with exit code {code}"
    if logs is not None:
        message += f", last available logs (truncated to 20,000 chars):\n{logs}"
    return AttemptObservation(
        number=n,
        rayjob=RayJobObservation(
            name=f"tiny-a{n}",
            deployment_status="Failed",
            job_status="FAILED",
            reason="AppFailed",
            message=message,
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


def worker(n: int, i: int, **state: Any) -> PodObservation:
    healthy = {"phase": "Running", "node_name": "n2", "node_ready": True}
    return PodObservation(name=f"tiny-a{n}-worker-{i}", node_type="worker", **{**healthy, **state})
