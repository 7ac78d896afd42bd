"""Two trainer workers (data-parallel ranks in one gloo group, FSDP2, sharded checkpoints) on a real local Ray and
real TransferQueue, each attempt a fresh driver process (`launcher`):

    attempt 1  2 workers  rank 1 is SIGKILLed after writing its shard of step 4, before the controller heard back
                          -> the attempt ends; no step_4 (and no tmp_step_4), step_2 is the newest
    attempt 2  2 workers  resumes from step_2; the whole attempt is SIGKILLed after step 7 trained
                          -> its step_4 and step_6 are bit-identical to the uninterrupted 2-worker run's
    attempt 3  1 worker   resumes the 2-worker step_6 on one worker (DCP reshards) and finishes at 12: the weights
                          it loads are step_6's, and its rewards continue within the noise of the uninterrupted run

The uninterrupted run is the session's 2-worker reference for this configuration's math (`uninterrupted`, which
keys references by the number of trainer workers too: their sums round otherwise). The math is that of
test_exact_resume, with trainerWorkers 2.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from support import launcher, weights
from support.uninterrupted import References
from trainingrun_runtime.driver import events
from trainingrun_runtime.grpo import sharding
from trainingrun_runtime.storage import layout, verification

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

STEPS = 12
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
    code = first.wait(300)
    assert code != 0, first.output()[-3000:]
    first.kill()
    second = launcher.start(run="killed", attempt=2, root=root, config=CONFIG, crash_at="trained@7", event_log=log)
    second.wait_for_marker("trained", 7, timeout=600)
    second.kill()
    (root / "after-attempt-2.json").write_text(json.dumps(sorted(p.name for p in (root / "killed").iterdir())))
    third = launcher.start(run="killed", attempt=3, root=root, config=_on(1), event_log=log)
    assert third.wait(600) == 0, third.output()[-3000:]
    return root


def test_a_rank_lost_after_writing_its_shard_leaves_no_step_and_the_next_attempt_resumes_from_the_one_before(
    runs: Path,
) -> None:
    selected = [e["step"] for e in events.read(runs / "killed.jsonl") if e["event"] == "checkpoint_selected"]
    assert selected == [None, 2, 6]
    after_first = [e for e in events.read(runs / "killed.jsonl") if e["event"] == "checkpoint_committed"]
    assert [e["step"] for e in after_first][:1] == [2]
    # step_4 of attempt 1 never appeared: attempt 2 wrote the step_4 that is there (its manifest says so)
    assert verification.verify(runs / "killed" / "step_4", run="killed").attempt == 2
    assert not [p for p in (runs / "killed").iterdir() if p.name.startswith("tmp_step_")]


def test_two_workers_write_one_shard_each_and_resume_bit_identical_on_two(
    runs: Path, uninterrupted: References
) -> None:
    straight = uninterrupted(CONFIG).weights
    for step in (2, 4, 6):
        saved = verification.verify(runs / "killed" / layout.step_dirname(step), run="killed")
        assert {sharding.shard_file(0), sharding.shard_file(1)} <= {Path(f).name for f in saved.files}
        assert saved.weights_sha256 == straight[step], f"step {step} diverged"
    weights.assert_moved({s: straight[s] for s in (2, 4, 6)}, at_least=3)


def test_a_two_worker_checkpoint_resumes_on_one_worker_and_training_goes_on_within_the_noise(
    runs: Path, uninterrupted: References
) -> None:
    reference = uninterrupted(CONFIG)
    log = events.read(runs / "killed.jsonl")
    last = log[max(i for i, e in enumerate(log) if e["event"] == "driver_started") :]
    finished = [e for e in last if e["event"] == "finished"]
    assert finished and finished[-1]["step"] == STEPS
    rewards = {e["step"]: e["reward"] for e in last if e["event"] == "step_done"}
    assert sorted(rewards) == list(range(7, STEPS + 1))
    gap = sum(abs(rewards[s] - reference.rewards[s]) for s in rewards) / len(rewards)
    assert gap < 0.05, (rewards, reference.rewards)
    one = verification.verify(runs / "killed" / layout.step_dirname(8), run="killed")
    assert {Path(f).name for f in one.files if f.startswith(f"{layout.POLICY}/")} == {
        sharding.METADATA_FILE, sharding.shard_file(0), "trainer.json"
    }  # fmt: skip
