"""Exact resume: a run SIGKILLed at five different points and resumed each time ends bit-identical to a run that
was never interrupted, and its ledger shows every prompt consumed exactly once.

Both runs use the in_order sampler, a fixed seed and deterministic torch, on real local Ray and real
TransferQueue, each attempt a fresh driver process (`launcher`). The interrupted run is killed (its whole process
group, as a pod dies) at, in order:

    reported@2           step_2 committed and reported, training going on -> resumes from step_2
    policy_saved@4       inside the save, before the barrier cut          -> resumes from step_2
    data_plane_saved@6   inside the save, TransferQueue snapshot written  -> resumes from step_4
    manifest_written@8   between the save and the rename                  -> resumes from step_6
    renamed@10           after the rename, before the parent fsync/report -> resumes from step_10

and then finishes. Attempt 1 is given a step limit of 8 and the last attempt a log period of 3: fields that are
not math, which a resume may change. Every resume restores TransferQueue first, then the loader's place and the
replay index exactly as the step holds them. Every checkpoint both runs wrote at the same step must carry the same
weights_sha256. The uninterrupted run is the session's reference for this configuration's math (`uninterrupted`,
tests/conftest.py), shared with the other tests that compare against it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from support import launcher, weights
from support.uninterrupted import References
from trainingrun_runtime.driver import events
from trainingrun_runtime.rollout import ledger
from trainingrun_runtime.storage import layout, manifest, verification

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

STEPS, PROMPTS = 12, 4
CONFIG: dict[str, Any] = {
    "trainer": {
        "steps": STEPS,
        "promptsPerStep": PROMPTS,
        "generationWorkers": 1,
        "seed": 7,
        "grpo": {"groupSize": 4},
        "task": {"datasetSize": 48},
    },
    "checkpoint": {"savePeriod": 2, "keepLast": 10},
}
KILLS = [
    # Not a kill at a step's training (trained@3): the save of step 2 is written and committed in the background while
    # step 3 trains, so whether step_2 is complete when that point freezes the controller is timing.
    ("reported", 2, 2),
    ("policy_saved", 4, 2),
    ("data_plane_saved", 6, 4),
    ("manifest_written", 8, 6),
    ("renamed", 10, 10),
]


def harmless(**trainer: Any) -> dict[str, Any]:
    """CONFIG with trainer fields that are not math (the step limit, the log period) changed: a resume across the
    change continues, and exactly (attempt 2 resumes attempt 1's step limit of 8 as 12, attempt 6 logs every 3)."""
    changed = json.loads(json.dumps(CONFIG))
    changed["trainer"].update(trainer)
    return changed


def _manifests(root: Path, run: str) -> dict[int, manifest.Manifest]:
    out = {}
    for path in sorted((root / run).glob("step_*")):
        m = verification.verify(path, run=run)
        out[m.step] = m
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("exact-resume")
    for attempt, (point, step, _) in enumerate(KILLS, start=1):
        proc = launcher.start(
            run="killed",
            attempt=attempt,
            root=root,
            config=CONFIG if attempt > 1 else harmless(steps=STEPS - 4),  # a step limit it will not reach
            crash_at=f"{point}@{step}",
            event_log=root / "killed.jsonl",
        )
        proc.wait_for_marker(point, step, timeout=600)
        proc.kill()
    final = launcher.start(
        run="killed", attempt=len(KILLS) + 1, root=root, config=harmless(logEvery=3), event_log=root / "killed.jsonl"
    )
    assert final.wait(600) == 0, final.output()[-3000:]
    return root


def test_each_attempt_resumed_from_the_newest_checkpoint_the_kill_left(runs: Path) -> None:
    selected = [e["step"] for e in events.read(runs / "killed.jsonl") if e["event"] == "checkpoint_selected"]
    assert selected == [None] + [resumed_from for _, _, resumed_from in KILLS]


def test_each_resume_restores_the_step_the_loaders_place_and_the_replay_index_in_that_order(runs: Path) -> None:
    """TransferQueue is restored before any client, buffer or actor touches it (restore -> client -> buffer -> index
    -> pumps), and the loader's place and the replay index are those the selected step holds, in every resumed
    attempt (no later attempt saves a step an earlier one resumed from, so each step_N is what was restored)."""
    log = events.read(runs / "killed.jsonl")
    starts = [i for i, e in enumerate(log) if e["event"] == "driver_started"]
    resumed = []
    for begin, end in zip(starts, [*starts[1:], len(log)], strict=True):
        attempt = log[begin:end]
        order = [e["event"] for e in attempt]
        by_name = {e["event"]: e for e in attempt}
        step = by_name["checkpoint_selected"]["step"]
        if step is None:
            continue
        assert order.index("tq_started") < order.index("tq_restored") < order.index("actor_created"), order
        assert order.index("tq_restored") < order.index("client_connected") < order.index("buffer_built"), order
        assert order.index("buffer_built") < order.index("index_restored") < order.index("pumps_started"), order
        step_dir = runs / "killed" / layout.step_dirname(step)
        saved = verification.verify(step_dir, run="killed")
        loader_state = torch.load(step_dir / layout.TRAIN_DATALOADER, weights_only=True)
        index_state = torch.load(step_dir / layout.REPLAY_METADATA, weights_only=True)["replay"]
        assert by_name["tq_restored"]["step"] == by_name["policy_loaded"]["step"] == step
        assert by_name["pumps_started"]["step"] == step == loader_state["sampler"]["step"]
        assert by_name["pumps_started"]["next_uid"] == loader_state["loader"]["next_uid"]
        assert by_name["index_restored"]["digest"] == index_state["digest"] == saved.replay_digest
        assert by_name["index_restored"]["groups"] == len(index_state["groups"])
        resumed.append(step)
    assert resumed == [resumed_from for _, _, resumed_from in KILLS]


def test_the_killed_run_ends_bit_identical_to_the_uninterrupted_one(runs: Path, uninterrupted: References) -> None:
    straight, killed = uninterrupted(CONFIG).weights, _manifests(runs, "killed")
    assert max(straight) == max(killed) == STEPS
    finished = [e for e in events.read(runs / "killed.jsonl") if e["event"] == "finished"]
    assert finished[-1]["weights_sha256"] == straight[STEPS] == killed[STEPS].weights_sha256
    assert set(killed) == set(range(2, STEPS + 1, 2)), sorted(killed)  # every save; each compared below
    for step in sorted(killed):
        # (The replay digests may differ: which in-flight groups were already committed at a cut is timing.)
        assert killed[step].weights_sha256 == straight[step], f"step {step} diverged"
    weights.assert_moved({step: m.weights_sha256 for step, m in killed.items()}, at_least=STEPS // 2)


def test_the_ledger_shows_every_prompt_consumed_exactly_once_in_order(runs: Path) -> None:
    sidecar = torch.load(runs / "killed" / f"step_{STEPS}" / layout.REPLAY_METADATA, weights_only=True)
    book = ledger.Ledger()
    book.load_state_dict(sidecar["restart"]["ledger"])
    consumed = book.in_state(ledger.State.CONSUMED)
    assert consumed == list(range(STEPS * PROMPTS))
    book.check_served(sidecar["restart"]["loader"]["next_uid"])
    for uid in consumed:
        record = book.get(uid)
        assert (record.step, record.version) == (uid // PROMPTS, uid // PROMPTS)


def test_checkpoints_carried_unfinished_prompts_across_the_kills(runs: Path) -> None:
    # The resumes restored finished-but-untrained groups from TransferQueue and redispatched in-flight prompts.
    carried = 0
    for step in {resumed_from for _, _, resumed_from in KILLS}:
        sidecar = torch.load(runs / "killed" / f"step_{step}" / layout.REPLAY_METADATA, weights_only=True)
        states = [r[2] for r in sidecar["restart"]["ledger"]["records"]]
        carried += sum(s in ("in_flight", "committed", "queued") for s in states)
        assert len(sidecar["replay"]["groups"]) == states.count("committed")
    assert carried > 0
