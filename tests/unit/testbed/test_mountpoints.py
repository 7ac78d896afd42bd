"""The mountpoints a played Ray pod needs on the host (hack/testbed/mountpoints.py): created once, counted by pod,
removed with the last one; no mount is made here (a unit test: directories under tmp_path only)."""

from __future__ import annotations

from pathlib import Path

import mountpoints


def test_the_directories_made_for_a_mount_go_with_the_last_pod_that_needed_them(tmp_path: Path) -> None:
    points = mountpoints.Mountpoints()
    target = tmp_path / "checkpoints" / "run"
    first = points.ensure(target)
    second = points.ensure(target)
    assert first == second == tmp_path / "checkpoints"
    points.release(first)
    assert target.is_dir()
    points.release(second)
    assert not (tmp_path / "checkpoints").exists()


def test_a_release_after_the_runner_removed_everything_is_a_no_op(tmp_path: Path) -> None:
    points = mountpoints.Mountpoints()
    root = points.ensure(tmp_path / "checkpoints")
    assert root is not None
    points.remove_all()  # the runner stopped while a pod's kill was still finishing
    points.release(root)
    assert not root.exists()
