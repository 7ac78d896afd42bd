"""What makes a checkpoint durable, in order: every fsync of a save, of the owner file and of retention is recorded
(with the renames between them), so removing or reordering any of them fails here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from support.bundles import RUN, contents, save
from trainingrun_runtime.storage import fence, files, layout
from trainingrun_runtime.storage.retention import apply_retention

Call = tuple[str, ...]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[Call]:
    """Every fsync (by the path its descriptor names), rename, replace and tree removal, in the order they ran."""
    seen: list[Call] = []
    fsync, rename, replace, remove_tree = os.fsync, os.rename, os.replace, files.remove_tree

    def recorded_fsync(fd: int) -> None:
        seen.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def recorded_rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        seen.append(("rename", os.fspath(src), os.fspath(dst)))
        rename(src, dst)

    def recorded_replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        seen.append(("replace", os.fspath(src), os.fspath(dst)))
        replace(src, dst)

    def recorded_remove_tree(path: Path) -> None:
        seen.append(("remove", os.fspath(path)))
        remove_tree(path)

    monkeypatch.setattr(os, "fsync", recorded_fsync)
    monkeypatch.setattr(os, "rename", recorded_rename)
    monkeypatch.setattr(os, "replace", recorded_replace)
    monkeypatch.setattr(files, "remove_tree", recorded_remove_tree)
    return seen


def at(calls: list[Call], call: Call) -> int:
    assert call in calls, f"{call} is missing from {calls}"
    return calls.index(call)


def test_a_save_fsyncs_its_files_and_directories_then_the_manifest_then_renames_then_the_parent(
    tmp_path: Path, calls: list[Call]
) -> None:
    root = tmp_path.resolve()
    run_dir, tmp = root / RUN, root / RUN / "tmp_step_3"
    save(root, 3)
    manifest = at(calls, ("fsync", str(tmp / layout.MANIFEST)))
    for rel in contents(3):
        assert at(calls, ("fsync", str(tmp / rel))) < manifest, rel
    for directory in (tmp / "data_plane", tmp / "policy"):
        assert at(calls, ("fsync", str(directory))) < manifest, directory
    assert ("fsync", str(tmp)) in calls[:manifest]  # the tmp directory's entries, before the manifest
    tmp_again = manifest + 1 + at(calls[manifest + 1 :], ("fsync", str(tmp)))  # the manifest's entry, after it
    renamed = at(calls, ("rename", str(tmp), str(run_dir / "step_3")))
    parent = at(calls, ("fsync", str(run_dir)))
    assert manifest < tmp_again < renamed < parent
    assert calls[-1] == ("fsync", str(run_dir))


def test_a_re_save_makes_the_move_aside_durable_before_the_new_step_takes_its_name(
    tmp_path: Path, calls: list[Call]
) -> None:
    root = tmp_path.resolve()
    run_dir = root / RUN
    save(root, 3)
    calls.clear()
    save(root, 3, contents(3, "again"))
    moved = at(calls, ("rename", str(run_dir / "step_3"), str(run_dir / "old_step_3")))
    synced = moved + 1 + at(calls[moved + 1 :], ("fsync", str(run_dir)))
    renamed = at(calls, ("rename", str(run_dir / "tmp_step_3"), str(run_dir / "step_3")))
    parent = renamed + 1 + at(calls[renamed + 1 :], ("fsync", str(run_dir)))
    removed = at(calls, ("remove", str(run_dir / "old_step_3")))
    assert moved < synced < renamed < parent < removed


def test_the_owner_file_is_fsynced_before_it_replaces_the_old_one_and_the_directory_after(
    tmp_path: Path, calls: list[Call]
) -> None:
    run_dir = tmp_path.resolve() / RUN
    fence.claim(run_dir, "uid-1", 1)
    [replaced] = [c for c in calls if c[0] == "replace"]
    assert replaced[2] == str(run_dir / fence.OWNER_FILE)
    index = calls.index(replaced)
    assert calls[index - 1] == ("fsync", replaced[1])
    assert calls[index + 1] == ("fsync", str(run_dir))


def test_retention_makes_its_renames_durable_before_it_removes_anything(tmp_path: Path, calls: list[Call]) -> None:
    root = tmp_path.resolve()
    run_dir = root / RUN
    for step in (1, 2, 3):
        save(root, step)
    calls.clear()
    apply_retention(root, RUN, keep_last=1)
    renames = [calls.index(c) for c in calls if c[0] == "rename"]
    assert [calls[i][1:] for i in renames] == [
        (str(run_dir / f"step_{s}"), str(run_dir / f"del_step_{s}")) for s in (1, 2)
    ]
    synced = at(calls, ("fsync", str(run_dir)))
    removes = [calls.index(c) for c in calls if c[0] == "remove"]
    assert len(removes) == 2 and max(renames) < synced < min(removes)
