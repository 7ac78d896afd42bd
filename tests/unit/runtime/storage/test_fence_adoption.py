"""A run directory of the layout before the namespace level moves to its new place only if it names this run."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from trainingrun_runtime.storage import fence


def old_run_dir(root: Path, run: str, uid: str | None) -> Path:
    """`<root>/<run>` as the old layout left it: a checkpoint and, with a uid, the owner file."""
    run_dir = root / run
    (run_dir / "step_10").mkdir(parents=True)
    (run_dir / "step_10" / "manifest.json").write_text("{}")
    if uid is not None:
        (run_dir / fence.OWNER_FILE).write_text(json.dumps({"runUid": uid, "attempt": 3}))
    return run_dir


def test_a_directory_this_run_owns_moves_under_the_namespace_with_its_checkpoints(tmp_path: Path) -> None:
    legacy = old_run_dir(tmp_path, "tiny", "uid-1")
    new = tmp_path / "team-a" / "tiny"
    assert fence.adopt(legacy, new, "uid-1") is fence.Adoption.MOVED
    assert not legacy.exists()
    assert (new / "step_10" / "manifest.json").is_file() and fence.owner(new) == fence.Owner("uid-1", 3)


def test_a_directory_another_run_owns_is_left_alone_with_a_warning_naming_it_and_the_fix(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    legacy = old_run_dir(tmp_path, "tiny", "uid-of-team-b")
    new = tmp_path / "team-a" / "tiny"
    with caplog.at_level(logging.WARNING, logger=fence.__name__):
        assert fence.adopt(legacy, new, "uid-1") is fence.Adoption.OTHER_OWNER
    assert (legacy / "step_10").is_dir() and not new.exists()
    (warning,) = caplog.messages
    assert str(legacy) in warning and "uid-of-team-b" in warning and f"move it to {new} by hand" in warning


def test_a_directory_without_an_owner_file_is_left_alone_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    legacy = old_run_dir(tmp_path, "tiny", None)
    new = tmp_path / "team-a" / "tiny"
    with caplog.at_level(logging.WARNING, logger=fence.__name__):
        assert fence.adopt(legacy, new, "uid-1") is fence.Adoption.NO_OWNER
    assert (legacy / "step_10").is_dir() and not new.exists()
    (warning,) = caplog.messages
    assert str(legacy) in warning and "no owner file" in warning and f"move it to {new} by hand" in warning


def test_a_driver_without_a_run_uid_never_moves_a_directory(tmp_path: Path) -> None:
    legacy = old_run_dir(tmp_path, "tiny", "uid-1")
    assert fence.adopt(legacy, tmp_path / "ns" / "tiny", None) is fence.Adoption.NO_OWNER
    assert legacy.is_dir()


def test_a_damaged_owner_file_leaves_the_directory_alone(tmp_path: Path) -> None:
    legacy = old_run_dir(tmp_path, "tiny", None)
    (legacy / fence.OWNER_FILE).write_text("{half")
    assert fence.adopt(legacy, tmp_path / "ns" / "tiny", "uid-1") is fence.Adoption.UNREADABLE_OWNER
    assert legacy.is_dir()


def test_nothing_moves_when_the_new_directory_exists_already(tmp_path: Path) -> None:
    legacy = old_run_dir(tmp_path, "tiny", "uid-1")
    new = tmp_path / "ns" / "tiny"
    new.mkdir(parents=True)
    assert fence.adopt(legacy, new, "uid-1") is fence.Adoption.NOTHING
    assert (legacy / "step_10").is_dir() and list(new.iterdir()) == []


def test_nothing_happens_without_an_old_directory(tmp_path: Path) -> None:
    assert fence.adopt(tmp_path / "tiny", tmp_path / "ns" / "tiny", "uid-1") is fence.Adoption.NOTHING
    assert list(tmp_path.iterdir()) == []


def test_a_run_named_as_its_namespace_moves_into_its_own_old_directory(tmp_path: Path) -> None:
    legacy = old_run_dir(tmp_path, "default", "uid-1")
    new = tmp_path / "default" / "default"
    assert fence.adopt(legacy, new, "uid-1") is fence.Adoption.MOVED
    assert (new / "step_10" / "manifest.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["default"]
    assert sorted(p.name for p in legacy.iterdir()) == ["default"]


def test_a_move_cut_short_between_its_two_renames_is_finished_by_the_next_start(tmp_path: Path) -> None:
    aside = old_run_dir(tmp_path, "default" + fence.ADOPTING_SUFFIX, "uid-1")
    (tmp_path / "default").mkdir()  # the namespace directory the crashed start had made
    new = tmp_path / "default" / "default"
    assert fence.adopt(tmp_path / "default", new, "uid-1") is fence.Adoption.MOVED
    assert not aside.exists() and (new / "step_10" / "manifest.json").is_file()


def test_an_old_directory_that_holds_a_namespaces_run_directories_is_left_alone(tmp_path: Path) -> None:
    legacy = old_run_dir(tmp_path, "team-a", "uid-1")  # run team-a of the old layout, and namespace team-a's root
    fence.claim(legacy / "other", "uid-other", 1)
    assert fence.adopt(legacy, tmp_path / "default" / "team-a", "uid-1") is fence.Adoption.HOLDS_RUNS
    assert (legacy / "other" / fence.OWNER_FILE).is_file() and not (tmp_path / "default").exists()
