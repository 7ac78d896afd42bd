"""The run directory's owner file: a newer attempt, or a new run of the same name, stops an old driver's writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainingrun_runtime.errors import Superseded, TrainingRunError
from trainingrun_runtime.storage import fence


def test_the_first_claim_creates_the_directory_and_names_the_owner(tmp_path: Path) -> None:
    run_dir = tmp_path / "tiny"
    fence.claim(run_dir, "uid-1", 1)
    assert fence.owner(run_dir) == fence.Owner("uid-1", 1)
    assert [p.name for p in run_dir.iterdir()] == [fence.OWNER_FILE]


def test_a_newer_attempt_takes_over_and_the_older_one_may_no_longer_write(tmp_path: Path) -> None:
    fence.claim(tmp_path, "uid-1", 1)
    fence.check(tmp_path, "uid-1", 1)
    fence.claim(tmp_path, "uid-1", 2)
    with pytest.raises(Superseded, match=r"attempt 2 of run uid uid-1 owns .* \(attempt 1 was about to rename\)"):
        fence.check(tmp_path, "uid-1", 1, "rename")
    fence.check(tmp_path, "uid-1", 2)


def test_an_old_attempt_cannot_claim_back_a_directory_a_newer_attempt_owns(tmp_path: Path) -> None:
    fence.claim(tmp_path, "uid-1", 3)
    with pytest.raises(Superseded, match="about to start"):
        fence.claim(tmp_path, "uid-1", 2)
    assert fence.owner(tmp_path) == fence.Owner("uid-1", 3)


def test_the_same_attempt_started_again_keeps_its_claim(tmp_path: Path) -> None:
    fence.claim(tmp_path, "uid-1", 2)
    fence.claim(tmp_path, "uid-1", 2)
    fence.check(tmp_path, "uid-1", 2)


def test_a_new_run_of_the_same_name_takes_over_and_fences_every_attempt_of_the_old_one(tmp_path: Path) -> None:
    fence.claim(tmp_path, "old-uid", 5)
    fence.claim(tmp_path, "new-uid", 1)  # the old TrainingRun was deleted; its checkpoints were kept
    with pytest.raises(Superseded, match="took the directory over"):
        fence.check(tmp_path, "old-uid", 5)
    fence.check(tmp_path, "new-uid", 1)


def test_without_an_owner_file_anyone_may_write(tmp_path: Path) -> None:
    assert fence.owner(tmp_path) is None
    fence.check(tmp_path, None, 1)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", "not a valid owner file"),
        ('{"runUid": "u"}', "not a valid owner file"),
        ('{"attempt": -1}', "attempt must be an integer >= 0"),
        ('{"attempt": "2"}', "attempt must be an integer >= 0"),
        ('{"attempt": 2, "runUid": 7}', "runUid must be a string"),
    ],
)
def test_a_damaged_owner_file_is_refused_naming_the_file_and_the_fix(
    tmp_path: Path, content: str, problem: str
) -> None:
    (tmp_path / fence.OWNER_FILE).write_text(content)
    with pytest.raises(TrainingRunError, match=problem) as caught:
        fence.check(tmp_path, "u", 1)
    assert str(tmp_path / fence.OWNER_FILE) in str(caught.value)
    assert "delete it only if no attempt of this run is alive" in str(caught.value)


def test_the_owner_file_records_who_claimed(tmp_path: Path) -> None:
    fence.claim(tmp_path, "uid-1", 4)
    record = json.loads((tmp_path / fence.OWNER_FILE).read_text())
    assert record["runUid"] == "uid-1" and record["attempt"] == 4
    assert {"claimed", "host", "pid"} <= set(record)
