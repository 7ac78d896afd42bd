"""A control plane's run directory (hack/testbed/workdirs.py): created owned by this process, and swept only once
its owner is gone. $TMPDIR is tmp_path here, so the sweep never touches a real run directory."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

import workdirs


@pytest.fixture(autouse=True)
def private_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def run_dir(parent: Path, name: str, owner: int | None, *, age_seconds: float = 0) -> Path:
    path = parent / f"{workdirs.WORKDIR_PREFIX}{name}"
    path.mkdir()
    if owner is not None:
        (path / workdirs.OWNER_FILE).write_text(str(owner))
    then = time.time() - age_seconds
    os.utime(path, (then, then))
    return path


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_a_new_run_directory_is_short_private_and_owned_by_this_process(private_tmpdir: Path) -> None:
    created = workdirs.create()
    assert created.parent == private_tmpdir and created.name.startswith(workdirs.WORKDIR_PREFIX)
    assert (created / workdirs.OWNER_FILE).read_text() == str(os.getpid())
    assert created.stat().st_mode & 0o777 == 0o700


def test_the_sweep_removes_only_directories_whose_owner_is_gone_or_that_never_got_one_in_time(
    private_tmpdir: Path,
) -> None:
    dead = run_dir(private_tmpdir, "dead", dead_pid())
    alive = run_dir(private_tmpdir, "alive", os.getpid())
    init_owned = run_dir(private_tmpdir, "init", 1)  # alive: kept whether kill(1, 0) answers or is refused
    unowned_old = run_dir(private_tmpdir, "old", None, age_seconds=workdirs.UNOWNED_GRACE_SECONDS + 60)
    unowned_new = run_dir(private_tmpdir, "new", None)
    other = private_tmpdir / "trun-pr-other"
    other.mkdir()
    workdirs.sweep_stale()
    assert not dead.exists() and not unowned_old.exists()
    assert alive.exists() and init_owned.exists() and unowned_new.exists() and other.exists()


def test_creating_sweeps_first(private_tmpdir: Path) -> None:
    dead = run_dir(private_tmpdir, "dead", dead_pid())
    workdirs.create()
    assert not dead.exists()
