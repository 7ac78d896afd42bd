"""Retention: keep the last K valid steps and every M-th step; never delete the newest valid checkpoint."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trainingrun_runtime.errors import Superseded
from trainingrun_runtime.storage.commit import BundleWriter
from trainingrun_runtime.storage.layout import MANIFEST
from trainingrun_runtime.storage.retention import Lineage, apply_retention, set_aside
from trainingrun_runtime.storage.verification import discover, verify

RUN = "demo"


def save(root: Path, step: int) -> Path:
    pending = BundleWriter(root, RUN).begin(step)
    (pending.path / "data_plane").mkdir()
    (pending.path / "data_plane" / "storage_0.pkl").write_bytes(b"x" * (100 + step))
    return pending.commit(attempt=1, config_hash="c", replay_digest="d", replay_mode="authoritative")


def steps_on_disk(root: Path) -> list[int]:
    names = os.listdir(root / RUN)
    assert all(n.startswith("step_") for n in names), names
    return sorted(int(n.removeprefix("step_")) for n in names)


def flip_a_byte(step_dir: Path) -> None:
    p = step_dir / "data_plane" / "storage_0.pkl"
    data = bytearray(p.read_bytes())
    data[0] ^= 0xFF
    p.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("keep_last", "keep_every", "kept"),
    [
        (3, None, [8, 9, 10]),
        (2, 4, [4, 8, 9, 10]),
        (1, 5, [5, 10]),
        (0, None, [10]),  # the newest valid checkpoint survives even keep_last=0
        (0, 3, [3, 6, 9, 10]),
        (20, None, list(range(1, 11))),
        (1, 1, list(range(1, 11))),
    ],
)
def test_retention_keeps_the_last_k_and_every_mth_step(
    root: Path, keep_last: int, keep_every: int | None, kept: list[int]
) -> None:
    last = Path()
    for step in range(1, 11):
        last = save(root, step)
    result = apply_retention(root, RUN, keep_last, keep_every, verified=last)
    assert steps_on_disk(root) == kept
    assert [int(p.name.removeprefix("step_")) for p in result.kept] == kept
    assert sorted(int(p.name.removeprefix("step_")) for p in result.deleted) == sorted(set(range(1, 11)) - set(kept))


def test_a_corrupt_newest_step_is_kept_and_does_not_count_so_the_newest_valid_survives(root: Path) -> None:
    for step in range(1, 7):
        save(root, step)
    flip_a_byte(root / RUN / "step_6")  # same size: only a checksum can tell
    apply_retention(root, RUN, keep_last=1)
    assert steps_on_disk(root) == [5, 6]
    d = discover(root, RUN)
    assert d.chosen is not None and d.chosen.manifest.step == 5


def test_invalid_steps_older_than_the_newest_valid_are_deleted(root: Path) -> None:
    for step in range(1, 6):
        save(root, step)
    (root / RUN / "step_4" / MANIFEST).unlink()
    (root / RUN / "step_2" / "data_plane" / "storage_0.pkl").write_bytes(b"short")
    apply_retention(root, RUN, keep_last=3)
    # Step 4 and step 2 are invalid; the last three valid are 5, 3, 1.
    assert steps_on_disk(root) == [1, 3, 5]


def test_with_no_valid_checkpoint_retention_deletes_nothing(root: Path) -> None:
    for step in range(1, 4):
        save(root, step)
        (root / RUN / f"step_{step}" / MANIFEST).write_text("not json")
    result = apply_retention(root, RUN, keep_last=1)
    assert result.deleted == []
    assert steps_on_disk(root) == [1, 2, 3]


def test_retention_of_a_run_without_a_directory_does_nothing(root: Path) -> None:
    assert apply_retention(root, RUN, keep_last=1).deleted == []


def test_retention_leaves_no_trash_and_ignores_non_step_entries(root: Path) -> None:
    for step in range(1, 4):
        save(root, step)
    (root / RUN / "status.json").write_text("{}")
    apply_retention(root, RUN, keep_last=1)
    assert sorted(os.listdir(root / RUN)) == ["status.json", "step_3"]


@pytest.mark.parametrize(("keep_last", "keep_every"), [(-1, None), (1, 0), (1, -2)])
def test_retention_refuses_nonsense_arguments(root: Path, keep_last: int, keep_every: int | None) -> None:
    with pytest.raises(ValueError):
        apply_retention(root, RUN, keep_last, keep_every)


def test_a_protected_step_is_kept_beside_the_newest(root: Path) -> None:
    for step in (2, 4, 6, 8):
        save(root, step)
    apply_retention(root, RUN, keep_last=1, protect=(4,))
    assert steps_on_disk(root) == [4, 8]


def test_a_resumed_attempt_keeps_the_step_it_committed_below_an_older_lineage(root: Path) -> None:
    # Steps 30-50 of an older lineage (resume.step pinned at 10 below them); the resumed attempt commits 20.
    for step in (10, 30, 40, 50):
        save(root, step)
    committed = save(root, 20)
    result = apply_retention(
        root, RUN, keep_last=3, verified=committed, lineage=Lineage(resumed_from=10, written=frozenset({20}))
    )
    assert steps_on_disk(root) == [10, 20, 30, 40, 50]
    assert result.deleted == []
    assert [p.name for p in result.outside] == ["step_30", "step_40", "step_50"]
    assert verify(committed, run=RUN).step == 20


def test_retention_counts_only_the_lineage_and_deletes_within_it(root: Path) -> None:
    for step in (5, 10, 30, 40):
        save(root, step)
    save(root, 15)
    committed = save(root, 20)
    apply_retention(
        root, RUN, keep_last=1, verified=committed, lineage=Lineage(resumed_from=10, written=frozenset({15, 20}))
    )
    assert steps_on_disk(root) == [20, 30, 40]


def test_a_fresh_start_counts_nothing_it_did_not_write(root: Path) -> None:
    for step in (1, 2):
        save(root, step)
    committed = save(root, 3)
    apply_retention(root, RUN, keep_last=1, verified=committed, lineage=Lineage(resumed_from=None, written=frozenset()))
    assert steps_on_disk(root) == [1, 2, 3]


def test_the_guard_runs_after_verification_and_before_anything_is_deleted(root: Path) -> None:
    for step in range(1, 5):
        save(root, step)

    def superseded(doing: str) -> None:
        assert doing == "apply retention"
        raise Superseded("a newer attempt owns the directory")

    with pytest.raises(Superseded):
        apply_retention(root, RUN, keep_last=1, guard=superseded)
    assert steps_on_disk(root) == [1, 2, 3, 4]
    calls: list[str] = []
    apply_retention(root, RUN, keep_last=1, guard=calls.append)
    assert (calls, steps_on_disk(root)) == (["apply retention"], [4])


def test_steps_above_the_resume_point_that_the_status_does_not_record_are_set_aside_never_deleted(root: Path) -> None:
    for step in (2, 4, 6, 8):
        save(root, step)
    assert set_aside(root, RUN, above=4, recorded={2, 4, 6}) == [8]
    assert sorted(os.listdir(root / RUN)) == ["orphan_step_8", "step_2", "step_4", "step_6"]
    assert json.loads((root / RUN / "orphan_step_8" / MANIFEST).read_text())["step"] == 8  # whole, out of the way
    d = discover(root, RUN)
    assert d.chosen is not None and d.chosen.manifest.step == 6
    assert (
        root / RUN / "orphan_step_8",
        "moved aside: newer than the step an attempt resumed from, and never recorded",
    ) in d.skipped
    apply_retention(root, RUN, keep_last=1)
    assert sorted(os.listdir(root / RUN)) == ["orphan_step_8", "step_6"]


def test_a_second_orphan_of_the_same_step_takes_a_name_of_its_own(root: Path) -> None:
    save(root, 8)
    set_aside(root, RUN, above=4, recorded=())
    save(root, 8)
    assert set_aside(root, RUN, above=4, recorded=()) == [8]
    assert sorted(os.listdir(root / RUN)) == ["orphan_step_8", "orphan_step_8.1"]
    assert set_aside(root, "other", above=0, recorded=()) == []
