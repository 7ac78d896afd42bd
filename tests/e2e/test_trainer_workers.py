"""Two trainer workers (data-parallel ranks in one gloo group, FSDP2, sharded checkpoints written in the
background) on a real local Ray and real TransferQueue, each attempt a fresh driver process (`launcher`):

    attempt 1  2 workers  rank 1 is SIGKILLed after writing its shard of step 4, before the controller heard back
                          -> the attempt ends; no step_4 (and no tmp_step_4), step_2 is the newest
    attempt 2  2 workers  resumes from step_2; step 6's save is held in the background (rank 0 holds before it
                          answers) while steps 7 and 8 train, then the whole attempt is SIGKILLed
                          -> no step_6; its step_4 is bit-identical to the uninterrupted 2-worker run's
    attempt 3  1 worker   resumes the 2-worker step_4 on one worker (DCP reshards) and finishes at 12: the weights
                          it loads are step_4's, and its rewards continue within the noise of the uninterrupted run

And kills at random moments (seeded: E2E_CHAOS_SEED replays them), on 2 workers throughout:

    attempt 1  a random rank holds its answer to a random step's save (its shard written, the step not committed)
               while training goes on, and the attempt is SIGKILLed a random time into that hold
    attempt 2  SIGKILLed a random time after a random step, wherever that lands (a step, a save, a background write)
    attempt 3  finishes: every step either run recorded is bit-identical to the uninterrupted 2-worker run's, and
               every prompt was consumed exactly once

The uninterrupted run is the session's 2-worker reference for this configuration's math (`uninterrupted`, which
keys references by the number of trainer workers too: their sums round otherwise). The math is that of
test_exact_resume, with trainerWorkers 2.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from support import launcher, seeds, waiting, weights
from support.uninterrupted import References
from trainingrun_runtime.driver import events
from trainingrun_runtime.grpo import sharding
from trainingrun_runtime.rollout import ledger
from trainingrun_runtime.storage import layout, verification

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

STEPS = 12
SEED = 2711  # the default seed of the random kills' moments (E2E_CHAOS_SEED overrides it; support/seeds.py)
CONFIG: dict[str, Any] = {
    "trainer": {
        "steps": STEPS,
        "promptsPerStep": 4,
        "generationWorkers": 1,
        "trainerWorkers": 2,
        "seed": 7,
        "grpo": {"groupSize": 4},
        "task": {"datasetSize": 48},
    },
    "checkpoint": {"savePeriod": 2, "keepLast": 10},
}


def _on(workers: int) -> dict[str, Any]:
    changed = json.loads(json.dumps(CONFIG))
    changed["trainer"]["trainerWorkers"] = workers
    return changed


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("trainer-workers")
    log = root / "killed.jsonl"
    first = launcher.start(run="killed", attempt=1, root=root, config=CONFIG, crash_at="rank1_saved@4", event_log=log)
    first.wait_for_marker("rank1_saved", 4, timeout=600)
    os.kill(int((first.marker_dir / "crashed-at-rank1_saved@4").read_text()), signal.SIGKILL)  # that rank only
    assert first.wait(300) != 0, first.output()[-3000:]
    first.kill()
    # Rank 0 holds step 6's save unanswered (its shard written, the step not committed) while training goes on;
    # the controller then freezes after step 8 trained, before step 8's save, and the whole attempt is killed.
    held = "rank0_saved@6~600,trained@8"
    second = launcher.start(run="killed", attempt=2, root=root, config=CONFIG, crash_at=held, event_log=log)
    second.wait_for_marker("trained", 8, timeout=600)
    assert (second.marker_dir / "held-at-rank0_saved@6").exists()
    second.kill()
    third = launcher.start(run="killed", attempt=3, root=root, config=_on(1), event_log=log)
    assert third.wait(600) == 0, third.output()[-3000:]
    return root


def _attempt(log: list[dict[str, Any]], number: int) -> list[dict[str, Any]]:
    starts = [i for i, e in enumerate(log) if e["event"] == "driver_started"]
    if len(starts) < number:
        return []
    return log[starts[number - 1] : starts[number] if len(starts) > number else len(log)]


def test_a_rank_lost_after_writing_its_shard_leaves_no_step_and_the_next_attempt_resumes_from_the_one_before(
    runs: Path,
) -> None:
    log = events.read(runs / "killed.jsonl")
    assert [e["step"] for e in _attempt(log, 1) if e["event"] == "checkpoint_committed"] == [2]
    assert [e["step"] for e in log if e["event"] == "checkpoint_selected"][:2] == [None, 2]
    assert verification.verify(runs / "killed" / "step_4", run="killed").attempt == 2  # attempt 1 left no step_4


def test_a_kill_while_a_save_is_written_in_the_background_leaves_the_step_before_it_the_newest(runs: Path) -> None:
    """Training went on to step 8 while step 6's save was still unanswered (the train pump waited only for the copy
    into host memory and the cut); the kill then left no step_6, and the next attempt resumed from step_4."""
    log = events.read(runs / "killed.jsonl")
    second = _attempt(log, 2)
    assert [e["step"] for e in second if e["event"] == "checkpoint_committed"] == [4]
    assert max(e["step"] for e in second if e["event"] == "step_done") == 7  # and step 8 trained: frozen there
    assert [e["step"] for e in log if e["event"] == "checkpoint_selected"] == [None, 2, 4]
    assert not [p for p in (runs / "killed").iterdir() if p.name.startswith("tmp_step_")]


def test_two_workers_write_one_shard_each_and_resume_bit_identical_on_two(
    runs: Path, uninterrupted: References
) -> None:
    straight = uninterrupted(CONFIG).weights
    for step in (2, 4):
        saved = verification.verify(runs / "killed" / layout.step_dirname(step), run="killed")
        assert {sharding.shard_file(0), sharding.shard_file(1)} <= {Path(f).name for f in saved.files}
        assert saved.weights_sha256 == straight[step], f"step {step} diverged"
    weights.assert_moved({s: straight[s] for s in (2, 4)}, at_least=2)


def test_a_two_worker_checkpoint_resumes_on_one_worker_and_training_goes_on_within_the_noise(
    runs: Path, uninterrupted: References
) -> None:
    reference = uninterrupted(CONFIG)
    last = _attempt(events.read(runs / "killed.jsonl"), 3)
    finished = [e for e in last if e["event"] == "finished"]
    assert finished and finished[-1]["step"] == STEPS
    rewards = {e["step"]: e["reward"] for e in last if e["event"] == "step_done"}
    assert sorted(rewards) == list(range(5, STEPS + 1))
    gap = sum(abs(rewards[s] - reference.rewards[s]) for s in rewards) / len(rewards)
    assert gap < 0.05, (rewards, reference.rewards)
    one = verification.verify(runs / "killed" / layout.step_dirname(8), run="killed")
    assert {Path(f).name for f in one.files if f.startswith(f"{layout.POLICY}/")} == {
        sharding.METADATA_FILE, sharding.shard_file(0), "trainer.json"
    }  # fmt: skip


def _steps_done(log: Path, attempt: int) -> int:
    return max((e["step"] for e in _attempt(events.read(log), attempt) if e["event"] == "step_done"), default=0)


def test_kills_at_random_moments_during_background_writes_resume_bit_identical_on_two_workers(
    tmp_path: Path, uninterrupted: References, request: pytest.FixtureRequest
) -> None:
    rng = random.Random(seeds.chosen(request.node, default=SEED))
    log = tmp_path / "random.jsonl"
    run_dir = tmp_path / "random"

    held, rank = rng.choice([4, 6]), rng.randrange(2)
    first = launcher.start(run="random", attempt=1, root=tmp_path, config=CONFIG, event_log=log,
                           crash_at=f"rank{rank}_saved@{held}~600")  # fmt: skip
    first.wait_for_marker(f"rank{rank}_saved", held, timeout=600, held=True)
    time.sleep(rng.uniform(0, 3))  # training goes on meanwhile, up to the next save (at most one in flight)
    first.kill()
    assert not (run_dir / layout.step_dirname(held)).exists(), "the held save was committed before the kill"

    after = rng.randint(held - 1, STEPS - 2)
    second = launcher.start(run="random", attempt=2, root=tmp_path, config=CONFIG, event_log=log)

    def reached() -> bool:
        assert second.exit_code() is None, second.output()[-3000:]
        return _steps_done(log, 2) >= after

    waiting.wait(reached, timeout=600, what=f"attempt 2 at step {after}", interval=0.05)
    time.sleep(rng.uniform(0, 1))  # the random moment itself: wherever it lands (a step, a save, a write)
    second.kill()

    third = launcher.start(run="random", attempt=3, root=tmp_path, config=CONFIG, event_log=log)
    assert third.wait(600) == 0, third.output()[-3000:]

    history = events.read(log)
    selected = [e["step"] for e in history if e["event"] == "checkpoint_selected"]
    assert selected[:2] == [None, held - 2], selected  # the held step was never taken for a complete one
    reference = uninterrupted(CONFIG)
    recorded = sorted(int(p.name.removeprefix("step_")) for p in run_dir.glob("step_*"))
    assert STEPS in recorded and held - 2 in recorded, recorded
    for step in recorded:
        saved = verification.verify(run_dir / layout.step_dirname(step), run="random")
        assert saved.weights_sha256 == reference.at(step), f"step {step} diverged (attempt {saved.attempt})"
    finished = [e for e in history if e["event"] == "finished"]
    assert finished and finished[-1]["weights_sha256"] == reference.at(STEPS)
    last = verification.open_verified(run_dir / layout.step_dirname(STEPS))
    book = ledger.Ledger()
    book.load_state_dict(torch.load(last.replay_metadata, weights_only=True)["restart"]["ledger"])
    assert book.in_state(ledger.State.CONSUMED) == list(range(STEPS * CONFIG["trainer"]["promptsPerStep"]))
    assert not [p for p in run_dir.iterdir() if p.name.startswith("tmp_step_")]
