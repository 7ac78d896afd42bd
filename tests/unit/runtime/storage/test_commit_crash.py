"""Crash consistency: SIGKILL the saving process between every two steps of the commit sequence.

Each case runs a real save in a subprocess that sends SIGKILL to itself at one stage;
afterwards discovery must return either the new checkpoint, complete, or the previous
one — never a partial one — and the next save must start from a clean directory.
The directories live on tmpfs when the machine has one: a process kill does not depend on
fsync reaching the disk, and tmpfs keeps these tests fast.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import trainingrun_runtime
from trainingrun_runtime.storage.commit import COMMIT_STAGES, BundleWriter
from trainingrun_runtime.storage.verification import discover, verify

RUN = "demo"
PACKAGE_ROOT = str(Path(trainingrun_runtime.__file__).resolve().parent.parent)

SAVER = textwrap.dedent(
    """
    import os, signal, sys
    from trainingrun_runtime.storage.commit import BundleWriter

    root, step, attempt, kill_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]

    def on_stage(name):
        if name == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    pending = BundleWriter(root, "demo", on_stage=on_stage).begin(step)
    for rel, size in [("data_plane/storage_0.pkl", 300_000), ("data_plane/ctl.pkl", 100),
                      ("replay_buffer_metadata.pt", 1000), ("policy/weights.pt", 50_000)]:
        path = os.path.join(pending.path, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(bytes([attempt]) * size)
    on_stage("written")
    pending.commit(attempt=attempt, config_hash="c", replay_digest="d", replay_mode="authoritative")
    """
)

KILL_POINTS = ("written", *COMMIT_STAGES)


def run_saver(root: Path, step: int, attempt: int, kill_at: str) -> int:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [PACKAGE_ROOT, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(
        [sys.executable, "-c", SAVER, str(root), str(step), str(attempt), kill_at],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode in (0, -signal.SIGKILL), proc.stderr.decode()
    return proc.returncode


def seed(root: Path, step: int, attempt: int) -> None:
    pending = BundleWriter(root, RUN).begin(step)
    (pending.path / "data_plane").mkdir()
    (pending.path / "data_plane" / "storage_0.pkl").write_bytes(bytes([attempt]) * 1000)
    pending.commit(attempt=attempt, config_hash="c", replay_digest="d", replay_mode="authoritative")


def assert_clean_after_next_begin(root: Path) -> None:
    BundleWriter(root, RUN).begin(99).abort()
    leftovers = [n for n in os.listdir(root / RUN) if not n.startswith("step_")]
    assert leftovers == []


@pytest.mark.parametrize("kill_at", KILL_POINTS)
def test_a_save_killed_at_any_stage_leaves_the_new_checkpoint_complete_or_the_previous_one(
    root: Path, kill_at: str
) -> None:
    seed(root, 1, attempt=1)
    assert run_saver(root, 2, attempt=2, kill_at=kill_at) == -signal.SIGKILL
    d = discover(root, RUN)
    assert d.chosen is not None
    renamed = kill_at in COMMIT_STAGES[COMMIT_STAGES.index("renamed") :]
    if renamed:
        assert (d.chosen.manifest.step, d.chosen.manifest.attempt) == (2, 2)
    else:
        assert (d.chosen.manifest.step, d.chosen.manifest.attempt) == (1, 1)
    assert_clean_after_next_begin(root)
    again = discover(root, RUN)
    assert again.chosen is not None and again.chosen.manifest == d.chosen.manifest
    assert verify(root / RUN / f"step_{d.chosen.manifest.step}") == d.chosen.manifest


@pytest.mark.parametrize("kill_at", KILL_POINTS)
def test_a_resave_killed_at_any_stage_leaves_the_new_checkpoint_complete_or_the_previous_one(
    root: Path, kill_at: str
) -> None:
    seed(root, 1, attempt=1)
    seed(root, 2, attempt=1)
    assert run_saver(root, 2, attempt=2, kill_at=kill_at) == -signal.SIGKILL
    d = discover(root, RUN)
    assert d.chosen is not None
    assert d.chosen.manifest.step == 2
    renamed = kill_at in COMMIT_STAGES[COMMIT_STAGES.index("renamed") :]
    assert d.chosen.manifest.attempt == (2 if renamed else 1)
    assert_clean_after_next_begin(root)
    again = discover(root, RUN)
    assert again.chosen is not None and again.chosen.manifest == d.chosen.manifest
    assert again.chosen.path == root / RUN / "step_2"
