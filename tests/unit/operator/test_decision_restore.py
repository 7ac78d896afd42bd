"""The decision core when an attempt's restore fails: only a step that failed verification is marked bad.

A restore refused because spec.trainer changed the checkpoint's math fails the run as InvalidSpec, naming the
fields and the fix, and marks nothing; a restore interrupted by I/O, Ray or a timeout is retried from the same
step under the failure budget. Each way the operator can learn of it (the driver's restoreError, the exit code in
KubeRay's message, a local driver's exit code and stderr) is a row of the table. Journeys against an in-memory
status, as in the other `test_decision_*.py` files.
"""

from __future__ import annotations

import copy
import datetime
import pathlib
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from support.decisions import failed, running
from trainingrun_operator.core import decision, model, patching
from trainingrun_operator.core.decision import CreateAttempt, DeleteRayJob, Event
from trainingrun_operator.core.observation import AttemptObservation, PodObservation, RayJobObservation

EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / "manifests" / "examples" / "tiny.yaml"
T0 = datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC)

MISMATCH = (
    "ConfigMismatch: spec.trainer.grpo.lr: 0.01 -> 0.02 (changed since step_20 was trained; config hash 1a2b3c4d5e6f, "
    "this config 6f5e4d3c2b1a). A checkpoint resumes only under the math that wrote it: to resume from this run's "
    "checkpoints, set it back and start the run again (re-create the TrainingRun under the same name, or run "
    "`trainingrun run` again); to train with the new value, start a TrainingRun of another name from scratch"
)
"""The driver's last stderr line (and restoreError) when spec.trainer.grpo.lr was edited after step 20."""
OLD_MISMATCH = (
    "RestoreFailed: ConfigMismatch: step_20 was written with config hash 1a2b3c4d5e6f, the current config has "
    "6f5e4d3c2b1a; fields that change the math differ: trainer.grpo.lr: 0.01 -> 0.02"
)
"""The same, from a driver of the version before the config mismatch had its own exit code (it exited 3)."""
INTERRUPTED = (
    "RestoreInterrupted: OSError: [Errno 5] Input/output error: '/checkpoints/tiny/step_20/policy/model.pt' "
    "(not the checkpoint's fault: a new attempt may succeed)"
)
CORRUPT = "CheckpointCorrupt: /checkpoints/tiny/step_20/policy/model.pt: checksum mismatch (blake3 9a.., manifest 3f..)"


class Store:
    """A TrainingRun's status as the API server keeps it, plus the clock."""

    def __init__(self, **spec: Any) -> None:
        doc = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text())["spec"])
        doc["restartPolicy"] = {"failureBudget": 3, "backoff": {"initialSeconds": 10, "maxSeconds": 40, "factor": 2}}
        doc.update(spec)
        self.spec = model.TrainingRunSpec.model_validate(doc)
        self.status: dict[str, Any] = {}
        self.now = T0

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
            )
        )
        self.status = patching.apply(self.status, result.patch)
        return result

    def checkpoint(self, attempt: int, step: int, manifest_blake3: str | None = None) -> None:
        """The driver's report of a renamed checkpoint, folded by a pass of the running attempt."""
        last = {"step": step, "path": f"/checkpoints/tiny/step_{step}", "attempt": attempt, "time": "t"}
        if manifest_blake3 is not None:
            last["manifestBlake3"] = manifest_blake3
        self.status["runtime"] = {
            "attempt": attempt,
            "step": step,
            "updated": "2025-01-01T00:00:00Z",
            "finished": False,
            "lastCheckpoint": last,
        }
        self.decide(running(attempt))

    @property
    def phase(self) -> str:
        return str(self.status.get("phase", "Pending"))

    @property
    def bad(self) -> list[int] | None:
        return (self.status.get("checkpoints") or {}).get("bad")


def preempted(n: int) -> AttemptObservation:
    head = PodObservation(name=f"tiny-a{n}-head", node_type="head", phase="Running", disruption="PreemptionByScheduler")
    return AttemptObservation(
        number=n,
        rayjob=RayJobObservation(name=f"tiny-a{n}", deployment_status="Running", job_status="RUNNING"),
        pods=(head,),
    )


def exited(n: int, code: int, line: str) -> AttemptObservation:
    """KubeRay's verdict on a driver that exited with `code`, its last stderr line `line` among the logs."""
    return failed(n, code, logs=f"INFO driver started\n{line}\n")


def exited_locally(n: int, code: int, line: str) -> AttemptObservation:
    """A local driver (`trainingrun run`) that exited with `code`; the tail of its log ends with `line`."""
    return AttemptObservation(number=n, backend="local", exit_code=code, stderr_tail=f"INFO driver started\n{line}")


def reported(store: Store, n: int, line: str) -> AttemptObservation:
    """The driver's status.runtime report of a failed restore (restoreError: `line`), its attempt still running."""
    store.status["runtime"] = {"attempt": n, "step": 0, "restoreError": line, "finished": False}
    return running(n)


def pinned_to_20(store: Store) -> None:
    """Attempt 1 records steps 10 and 20 and is preempted; attempt 2, pinned to 20 (10 its fallback), runs."""
    store.decide()
    store.decide(running(1))
    store.checkpoint(1, 10)
    store.checkpoint(1, 20)
    store.decide(preempted(1))
    assert [a for a in store.decide(AttemptObservation(number=1)).actions if isinstance(a, CreateAttempt)] == [
        CreateAttempt(2, "tiny-a2", 20, (10,))
    ]
    store.decide(running(2))
    assert store.phase == "Running"


Observe = Callable[[Store, int, str, int], AttemptObservation]
SEEN: list[tuple[str, Observe]] = [
    # (how the operator learns of it, (store, attempt number, the driver's line, its exit code) -> observation)
    ("reported", lambda store, n, line, code: reported(store, n, line)),
    ("KubeRay's exit code", lambda store, n, line, code: exited(n, code, line)),
    ("a local driver's exit code", lambda store, n, line, code: exited_locally(n, code, line)),
]

RESTORE_FAILURES: list[tuple[str, str, int, str, str, list[int] | None, str | None]] = [
    # (case, the driver's last line, exit code, phase, reason, checkpoints.bad after it, restart counter charged)
    ("the step is corrupt", f"RestoreFailed: {CORRUPT}", 3, "Restarting", "FailedRestore", [20], "failedRestore"),
    ("spec.trainer changed the math", MISMATCH, 6, "Failed", "InvalidSpec", None, None),
    ("an older driver's config mismatch", OLD_MISMATCH, 3, "Failed", "InvalidSpec", None, None),
    ("an I/O error", INTERRUPTED, 7, "Restarting", "InfrastructureFailure", None, "infrastructureFailure"),
]  # fmt: skip


@pytest.mark.parametrize(("seen", "observe"), SEEN, ids=[s[0] for s in SEEN])
@pytest.mark.parametrize(
    ("case", "line", "code", "phase", "reason", "bad", "charged"),
    RESTORE_FAILURES,
    ids=[r[0] for r in RESTORE_FAILURES],
)
def test_a_failed_restore_marks_the_step_bad_only_when_the_step_failed_verification(
    seen: str,
    observe: Observe,
    case: str,
    line: str,
    code: int,
    phase: str,
    reason: str,
    bad: list[int] | None,
    charged: str | None,
) -> None:
    store = Store()
    pinned_to_20(store)
    before = dict(store.status["restarts"])
    if seen == "reported" and line.startswith("RestoreFailed: "):
        line = line.removeprefix("RestoreFailed: ")  # restoreError is the line without it
    result = store.decide(observe(store, 2, line, code))
    assert (store.phase, store.status["reason"]) == (phase, reason), case
    assert store.bad == bad
    assert store.status["attempt"]["reason"] == reason and store.status["attempt"]["end"]
    after = store.status["restarts"]
    assert {k: after[k] - before[k] for k in after if after[k] != before[k]} == (
        {charged: 1, "total": 1} if charged else {}
    )
    if seen != "a local driver's exit code":  # a local attempt has no RayJob; its exited driver no process left
        assert DeleteRayJob("tiny-a2") in result.actions


@pytest.mark.parametrize(("seen", "observe"), SEEN, ids=[s[0] for s in SEEN])
def test_a_config_mismatch_fails_the_run_as_invalid_spec_naming_the_field_and_the_fix(
    seen: str, observe: Observe
) -> None:
    store = Store()
    pinned_to_20(store)
    result = store.decide(observe(store, 2, MISMATCH, 6))
    message = store.status["message"]
    assert message.startswith("spec.trainer.grpo.lr: 0.01 -> 0.02"), "the field first, as any InvalidSpec"
    assert "set it back" in message and "another name" in message
    condition = next(c for c in store.status["conditions"] if c["type"] == "Failed")
    assert (condition["status"], condition["reason"], condition["message"]) == ("True", "InvalidSpec", message)
    warnings = [a for a in result.actions if isinstance(a, Event) and a.type == "Warning"]
    assert [w.reason for w in warnings] == ["InvalidSpec"] and warnings[0].message == message
    assert store.status["checkpoints"]["latest"]["step"] == 20 and store.bad is None
    store.now += datetime.timedelta(minutes=5)
    later = store.decide(AttemptObservation(number=2))
    assert store.phase == "Failed" and not [a for a in later.actions if isinstance(a, CreateAttempt)]


@pytest.mark.parametrize(("seen", "observe"), SEEN, ids=[s[0] for s in SEEN])
def test_an_interrupted_restore_is_retried_from_the_same_step_after_the_backoff(seen: str, observe: Observe) -> None:
    store = Store()
    pinned_to_20(store)
    store.decide(observe(store, 2, INTERRUPTED, 7))
    assert store.status["nextAttemptTime"] == "2025-01-01T00:00:10.000Z"
    assert "the next attempt resumes from the same step" in store.status["message"]
    store.now += datetime.timedelta(seconds=10)
    created = [a for a in store.decide(AttemptObservation(number=2)).actions if isinstance(a, CreateAttempt)]
    assert created == [CreateAttempt(3, "tiny-a3", 20, (10,))]


def test_after_a_failed_verification_the_next_attempt_resumes_from_the_older_step() -> None:
    store = Store()
    pinned_to_20(store)
    store.decide(reported(store, 2, CORRUPT))
    store.now += datetime.timedelta(seconds=10)
    created = [a for a in store.decide(AttemptObservation(number=2)).actions if isinstance(a, CreateAttempt)]
    assert created == [CreateAttempt(3, "tiny-a3", 10)]


def test_interrupted_restores_in_a_row_exhaust_the_failure_budget_and_leave_every_step_restorable() -> None:
    store = Store()
    pinned_to_20(store)
    for n in (2, 3, 4):
        store.decide(reported(store, n, INTERRUPTED))
        if n < 4:
            assert store.phase == "Restarting"
            store.now += datetime.timedelta(minutes=1)
            store.decide(AttemptObservation(number=n))
            assert store.status["attempt"]["resumedFrom"] == 20
            store.decide(running(n + 1))
    assert (store.phase, store.status["reason"]) == ("Failed", "BudgetExhausted")
    assert store.status["restarts"]["infrastructureFailure"] == 3 and store.bad is None


@pytest.mark.parametrize(
    ("line", "phase", "reason"),
    [
        (MISMATCH, "Failed", "InvalidSpec"),
        (INTERRUPTED, "Restarting", "InfrastructureFailure"),
        (CORRUPT, "Failed", "PermanentFailure"),
    ],
    ids=["config mismatch", "interrupted", "failed verification"],
)
def test_a_failed_restore_of_the_drivers_own_choice_is_permanent_only_when_it_failed_verification(
    line: str, phase: str, reason: str
) -> None:
    store = Store()
    store.decide()
    store.decide(running(1))
    assert store.status["attempt"].get("resumedFrom") is None, "no step recorded: the driver chooses the newest"
    store.decide(reported(store, 1, line))
    assert (store.phase, store.status["reason"]) == (phase, reason)
    assert store.bad is None


def test_the_next_attempt_is_given_the_recorded_manifest_blake3_of_its_pinned_and_fallback_steps() -> None:
    """Issue 24, item 9: the driver refuses a manifest that does not hash as the status recorded it."""
    store = Store()
    store.decide()
    store.decide(running(1))
    store.checkpoint(1, 10)  # reported by a driver from before manifestBlake3: no hash to hand on
    store.checkpoint(1, 20, "a" * 64)
    store.checkpoint(1, 30, "b" * 64)
    assert store.status["checkpoints"]["latest"]["manifestBlake3"] == "b" * 64
    store.decide(preempted(1))
    created = [a for a in store.decide(AttemptObservation(number=1)).actions if isinstance(a, CreateAttempt)]
    assert created == [CreateAttempt(2, "tiny-a2", 30, (20, 10), manifest_blake3=((20, "a" * 64), (30, "b" * 64)))]


def test_a_step_recorded_again_by_a_later_attempt_is_given_the_hash_of_its_newest_record() -> None:
    store = Store(resume={"policy": "step", "step": 10})
    store.decide()
    store.decide(running(1))
    store.checkpoint(1, 10, "a" * 64)
    store.checkpoint(1, 20, "b" * 64)
    store.decide(preempted(1))
    store.decide(AttemptObservation(number=1))
    store.decide(running(2))
    store.checkpoint(2, 20, "c" * 64)  # attempt 2 resumed from the pinned step 10 and saved step 20 anew
    store.decide(preempted(2))
    created = [a for a in store.decide(AttemptObservation(number=2)).actions if isinstance(a, CreateAttempt)]
    assert [a.manifest_blake3 for a in created] == [((10, "a" * 64), (20, "c" * 64))]
