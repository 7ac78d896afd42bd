"""The preemption notice on real local Ray with real TransferQueue: the head pod's preStop hook (played here by
writing its request, `sdk.notice`) reaches the controller at a step boundary.

- With time to spare, the driver saves the step it is at (reason PreemptionNotice), answers, and exits 5
  (`Preempted:`); the next attempt resumes from that step and the run ends with the weights of a run that was never
  interrupted.
- With a deadline too close for a save, it saves nothing, answers so, and exits 5; no partial checkpoint is left
  and the next attempt resumes from the newest complete one.
- A notice that comes while a periodic save is under way is answered with that save: one checkpoint, not two.

The moment is fixed with a held crash point (`trained@N~S`: the driver stalls there for S seconds, then goes on).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from support import launcher, weights
from support.uninterrupted import References
from trainingrun_runtime.driver import events
from trainingrun_runtime.sdk import notice
from trainingrun_runtime.storage import verification

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

STEPS = 10
CONFIG: dict[str, Any] = {
    "trainer": {
        "steps": STEPS,
        "promptsPerStep": 4,
        "generationWorkers": 1,
        "seed": 7,
        "grpo": {"groupSize": 4},
        "task": {"datasetSize": 48},
    },
    "checkpoint": {"savePeriod": 4, "keepLast": 10},
}


def held(root: Path, run: str, point: str, step: int, timeout: float = 600) -> None:
    marker = root / run / "crash-markers" / f"held-at-{point}@{step}"
    deadline = time.monotonic() + timeout
    while not marker.exists():
        assert time.monotonic() < deadline, f"{marker.name} not reached"
        time.sleep(0.05)


def steps_on_disk(root: Path, run: str) -> dict[int, dict[str, Any]]:
    """step -> manifest of every complete checkpoint; a torn one fails verification here."""
    return {int(p.name[5:]): verification.verify(p, run=run).extra for p in (root / run).glob("step_*")}


def stop_on_notice(root: Path, run: str, crash_at: str, point: str, step: int, seconds: float) -> launcher.Driver:
    """Attempt 1 of `run`, held at `point@step`; the notice comes then with `seconds` until its deadline."""
    proc = launcher.start(
        run=run, attempt=1, root=root, config=CONFIG, crash_at=crash_at, event_log=root / f"{run}.jsonl"
    )
    held(root, run, point, step)
    assert notice.listening(root, run, 1)
    notice.request(root, run, 1, deadline=time.time() + seconds, reason="test: the head pod is being deleted")
    assert proc.wait(300) == 5, proc.output()[-3000:]
    assert proc.output().strip().splitlines()[-1].startswith("Preempted: ")
    assert not notice.listening(root, run, 1)
    return proc


def answer(root: Path, run: str) -> dict[str, Any]:
    return dict(json.loads((root / run / "attempts" / "1" / notice.ANSWER_FILE).read_text()))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("notice")


@pytest.fixture(scope="module")
def straight(uninterrupted: References) -> dict[int, str]:
    """The weights of the run trained without a notice (the session's reference for this math) at 4, 6, 8 and the
    end."""
    reference = uninterrupted(CONFIG)
    return {step: reference.at(step) for step in (4, 6, 8, STEPS)}


def test_a_notice_with_time_to_spare_saves_the_step_and_the_resumed_run_ends_as_an_uninterrupted_one(
    root: Path, straight: dict[int, str]
) -> None:
    stop_on_notice(root, "spare", "trained@6~3", "trained", 6, seconds=60)
    assert answer(root, "spare")["step"] == 6
    saved = steps_on_disk(root, "spare")
    assert sorted(saved) == [4, 6] and saved[6]["reason"] == "PreemptionNotice" and saved[4]["reason"] == "Periodic"
    report = json.loads((root / "spare" / "attempts" / "1" / "runtime.json").read_text())
    assert report["lastCheckpoint"]["step"] == 6 and report["lastCheckpoint"]["reason"] == "PreemptionNotice"
    assert report["step"] == 6 and report["finished"] is False  # nothing trained past the saved step
    resumed_from = verification.verify(root / "spare" / "step_6").weights_sha256
    assert resumed_from == straight[6], "the notice's checkpoint holds the weights of its step"
    again = launcher.start(run="spare", attempt=2, root=root, config=CONFIG, event_log=root / "spare.jsonl")
    assert again.wait(600) == 0, again.output()[-3000:]
    selected = [e["step"] for e in events.read(root / "spare.jsonl") if e["event"] == "checkpoint_selected"]
    assert selected == [None, 6]
    resumed = steps_on_disk(root, "spare")
    assert verification.verify(root / "spare" / f"step_{STEPS}").weights_sha256 == straight[STEPS]
    weights.assert_moved(straight, at_least=4)
    assert resumed[STEPS]["reason"] == "Final"


def test_a_notice_too_close_to_its_deadline_saves_nothing_and_leaves_no_partial_checkpoint(root: Path) -> None:
    stop_on_notice(root, "short", "trained@6~3", "trained", 6, seconds=1.0)
    assert answer(root, "short")["step"] is None
    assert sorted(steps_on_disk(root, "short")) == [4]
    assert not list((root / "short").glob("tmp_step_*"))
    again = launcher.start(run="short", attempt=2, root=root, config=CONFIG, event_log=root / "short.jsonl")
    assert again.wait(600) == 0, again.output()[-3000:]
    selected = [e["step"] for e in events.read(root / "short.jsonl") if e["event"] == "checkpoint_selected"]
    assert selected == [None, 4]


def test_a_notice_during_a_periodic_save_is_answered_by_that_save(root: Path) -> None:
    stop_on_notice(root, "during", "policy_saved@4~3", "policy_saved", 4, seconds=60)
    assert answer(root, "during")["step"] == 4
    saved = steps_on_disk(root, "during")
    assert sorted(saved) == [4] and saved[4]["reason"] == "Periodic"
    committed = [e["step"] for e in events.read(root / "during.jsonl") if e["event"] == "checkpoint_committed"]
    assert committed == [4]


def test_a_save_under_way_still_answers_the_notice_when_the_operator_had_already_ended_the_attempt(
    root: Path,
) -> None:
    # The operator may end the attempt before the head's deletion shows (the eviction API sets DisruptionTarget, then
    # deletes): the commit's retention then finds the attempt ended. The checkpoint is complete and reported all the
    # same; it is reported again as the notice's, which the operator records for an ended attempt.
    run = "ended"
    proc = launcher.start(
        run=run, attempt=1, root=root, config=CONFIG, crash_at="policy_saved@4~3", event_log=root / f"{run}.jsonl"
    )
    held(root, run, "policy_saved", 4)
    status = {"attempt": {"number": 1, "end": "2026-01-01T00:00:00Z", "reason": "Preempted"}}
    (root / run / "status.json").write_text(json.dumps(status))
    notice.request(root, run, 1, deadline=time.time() + 60, reason="test: the head pod is being evicted")
    assert proc.wait(300) == 5, proc.output()[-3000:]
    assert answer(root, run)["step"] == 4
    assert "still answers the head's notice" in proc.output()
    saved = steps_on_disk(root, run)
    assert sorted(saved) == [4] and saved[4]["reason"] == "Periodic"
    report = json.loads((root / run / "attempts" / "1" / "runtime.json").read_text())
    assert report["lastCheckpoint"]["step"] == 4 and report["lastCheckpoint"]["reason"] == "PreemptionNotice"
