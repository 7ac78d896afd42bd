"""Crash points: an armed point freezes or holds the process at a named place; an unarmed one does nothing."""

from __future__ import annotations

import time
from pathlib import Path

from trainingrun_runtime.driver.crashpoints import CrashPoints


def test_an_unarmed_point_passes_at_once(tmp_path: Path) -> None:
    points = CrashPoints("trained@5", tmp_path)
    points.reach("trained", 4)
    points.reach("policy_saved", 5)
    assert list(tmp_path.iterdir()) == []


def test_a_held_point_leaves_a_marker_waits_and_goes_on(tmp_path: Path) -> None:
    points = CrashPoints("trained@5~0.3, policy_saved@6", tmp_path)
    assert points.armed == {("trained", 5): 0.3, ("policy_saved", 6): None}
    started = time.monotonic()
    points.reach("trained", 5)
    assert time.monotonic() - started >= 0.3
    assert (tmp_path / "held-at-trained@5").exists()
