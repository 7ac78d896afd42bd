"""The fence holds for the whole commit: a zombie attempt whose save outlasts a newer attempt's claim stops right
before its rename, never cleans a newer attempt's save in progress, and never replaces a newer attempt's step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.bundles import RUN, contents
from trainingrun_runtime.errors import Superseded
from trainingrun_runtime.storage import fence, layout
from trainingrun_runtime.storage.commit import BundleWriter, PendingBundle
from trainingrun_runtime.storage.verification import verify

UID = "uid-1"


def writer(root: Path, attempt: int, uid: str = UID) -> BundleWriter:
    run_dir = layout.run_dir(root, RUN)
    return BundleWriter(
        root, RUN, attempt=attempt, run_uid=uid, guard=lambda doing: fence.check(run_dir, uid, attempt, doing)
    )


def fill(pending: PendingBundle, tag: str = "") -> None:
    for rel, data in contents(pending.step, tag).items():
        p = pending.path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)


def commit(pending: PendingBundle, attempt: int) -> Path:
    return pending.commit(attempt=attempt, config_hash="c" * 64, replay_digest="d", replay_mode="authoritative")


def test_a_save_is_named_by_its_attempt(root: Path) -> None:
    fence.claim(layout.run_dir(root, RUN), UID, 3)
    pending = writer(root, 3).begin(7)
    assert pending.path.name == "tmp_step_7.attempt_3"
    assert layout.tmp_attempt_of(pending.path.name) == 3
    fill(pending)
    assert commit(pending, 3) == root / RUN / "step_7"
    assert verify(root / RUN / "step_7", run=RUN).extra["runUid"] == UID


def test_a_zombie_whose_save_outlasted_a_newer_claim_stops_right_before_the_rename(root: Path) -> None:
    run_dir = layout.run_dir(root, RUN)
    fence.claim(run_dir, UID, 1)
    zombie = writer(root, 1).begin(5)
    fill(zombie, "zombie")
    # While the zombie hashes and fsyncs (minutes on a big bundle), attempt 2 claims the directory and saves.
    fence.claim(run_dir, UID, 2)
    newer = run_dir / "tmp_step_6.attempt_2"
    newer.mkdir()
    (newer / "policy").write_bytes(b"being written")
    with pytest.raises(Superseded, match=r"attempt 1 was about to rename tmp_step_5\.attempt_1 to step_5"):
        commit(zombie, 1)
    assert not (run_dir / "step_5").exists()
    assert not zombie.path.exists()  # its own save, abandoned
    assert (newer / "policy").read_bytes() == b"being written"  # the newer attempt's save, untouched


def test_a_zombie_never_replaces_a_step_that_a_newer_attempt_committed(root: Path) -> None:
    run_dir = layout.run_dir(root, RUN)
    fence.claim(run_dir, UID, 2)
    newer = writer(root, 2).begin(5)
    fill(newer, "newer")
    commit(newer, 2)
    before = (run_dir / "step_5" / layout.MANIFEST).read_bytes()
    # A zombie of attempt 1 that got past its fence check (the window between the check and the rename).
    zombie = BundleWriter(root, RUN, attempt=1, run_uid=UID).begin(5)
    fill(zombie, "zombie")
    with pytest.raises(Superseded, match=r"step_5 was written by attempt 2, newer than attempt 1: not replaced"):
        commit(zombie, 1)
    assert (run_dir / "step_5" / layout.MANIFEST).read_bytes() == before
    assert verify(run_dir / "step_5", run=RUN).attempt == 2
    assert sorted(p.name for p in run_dir.iterdir()) == [fence.OWNER_FILE, "step_5"]


def test_a_new_run_of_the_same_name_replaces_a_step_of_the_deleted_run(root: Path) -> None:
    run_dir = layout.run_dir(root, RUN)
    old = BundleWriter(root, RUN, attempt=4, run_uid="uid-old").begin(5)
    fill(old, "old")
    commit(old, 4)
    fence.claim(run_dir, "uid-new", 1)
    new = writer(root, 1, uid="uid-new").begin(5)
    fill(new, "new")
    commit(new, 1)
    m = verify(run_dir / "step_5", run=RUN)
    assert (m.attempt, m.extra["runUid"]) == (1, "uid-new")


def test_begin_cleans_its_own_and_older_saves_but_never_a_newer_attempts(root: Path) -> None:
    run_dir = layout.run_dir(root, RUN)
    fence.claim(run_dir, UID, 2)
    for name in ("tmp_step_3", "tmp_step_4.attempt_1", "tmp_step_5.attempt_2", "tmp_step_9.attempt_3", "del_step_1"):
        (run_dir / name).mkdir()
        (run_dir / name / "half").write_bytes(b"half")
    pending = BundleWriter(root, RUN, attempt=2, run_uid=UID).begin(6)
    left = sorted(p.name for p in run_dir.iterdir())
    assert left == [fence.OWNER_FILE, pending.path.name, "tmp_step_9.attempt_3"]
    assert (run_dir / "tmp_step_9.attempt_3" / "half").read_bytes() == b"half"


def test_a_superseded_attempt_cleans_nothing_at_the_start_of_a_save(root: Path) -> None:
    run_dir = layout.run_dir(root, RUN)
    fence.claim(run_dir, UID, 1)
    zombie = writer(root, 1)
    fence.claim(run_dir, UID, 2)
    # Attempt 2's save in progress, of an older version's naming: only the fence protects it.
    (run_dir / "tmp_step_8").mkdir()
    with pytest.raises(Superseded, match=r"attempt 1 was about to clean up and begin tmp_step_9\.attempt_1"):
        zombie.begin(9)
    assert sorted(p.name for p in run_dir.iterdir()) == [fence.OWNER_FILE, "tmp_step_8"]


def test_a_commit_under_another_attempt_than_the_one_that_began_it_is_refused(root: Path) -> None:
    pending = BundleWriter(root, RUN, attempt=2).begin(1)
    fill(pending)
    with pytest.raises(ValueError, match="begun by attempt 2, committed as attempt 3"):
        commit(pending, 3)
    assert pending.path.is_dir()  # nothing was discarded: the caller aborts
    pending.abort()
    assert json.dumps(sorted(p.name for p in (root / RUN).iterdir())) == "[]"
