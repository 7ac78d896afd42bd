"""The commit of a bundle: every file listed with its size and checksum, the manifest last, the rename after it; re-
saves; what begin cleans."""

from __future__ import annotations

import json
import os
from pathlib import Path

import blake3
import pytest

from support.bundles import RUN, contents, save
from trainingrun_runtime.errors import CheckpointCorrupt, DigestError
from trainingrun_runtime.storage import commit, files
from trainingrun_runtime.storage.commit import BundleWriter
from trainingrun_runtime.storage.layout import DATA_PLANE, MANIFEST, REPLAY_METADATA
from trainingrun_runtime.storage.manifest import FileEntry
from trainingrun_runtime.storage.verification import discover, verify


def test_commit_lists_every_file_with_size_and_blake3_in_format_2_and_renames(tmp_path: Path) -> None:
    path = save(tmp_path, 4)
    assert path == tmp_path / RUN / "step_4"
    assert not (tmp_path / RUN / "tmp_step_4").exists()
    m = verify(path)
    written = contents(4)
    assert set(m.files) == set(written)
    for rel, data in written.items():
        assert m.files[rel].size == len(data)
    assert m.format_version == 2
    assert m.files[REPLAY_METADATA].digest == blake3.blake3((path / REPLAY_METADATA).read_bytes()).hexdigest()
    assert json.loads((path / MANIFEST).read_text())["files"][REPLAY_METADATA] == {
        "size": len(written[REPLAY_METADATA]),
        "blake3": m.files[REPLAY_METADATA].digest,
    }
    assert (m.run, m.step, m.attempt, m.replay_mode) == (RUN, 4, 1, "authoritative")
    assert m.created == "2025-01-02T03:04:05.678Z"
    assert m.extra == {"loader": {"epoch": 0, "index": 4}}
    assert m.weights_sha256 == "www"


def test_the_manifest_is_written_last_and_the_rename_comes_after_it(tmp_path: Path) -> None:
    seen: list[tuple[str, bool, bool]] = []
    run = tmp_path / RUN

    def on_stage(name: str) -> None:
        seen.append((name, (run / "tmp_step_1" / MANIFEST).exists(), (run / "step_1").exists()))

    save(tmp_path, 1, on_stage=on_stage)
    assert seen == [
        ("files_synced", False, False),
        ("manifest_written", True, False),
        ("old_moved", True, False),
        ("renamed", False, True),
        ("parent_synced", False, True),
        ("old_removed", False, True),
    ]
    assert [s for s, _, _ in seen] == list(commit.COMMIT_STAGES)


def test_begin_removes_leftover_tmp_dirs_of_crashed_saves(tmp_path: Path) -> None:
    run = tmp_path / RUN
    (run / "tmp_step_5" / DATA_PLANE).mkdir(parents=True)
    (run / "tmp_step_5" / DATA_PLANE / "half.pkl").write_bytes(b"half")
    (run / "tmp_step_2").mkdir()
    pending = BundleWriter(tmp_path, RUN).begin(5)
    assert list(pending.path.iterdir()) == []
    assert not (run / "tmp_step_2").exists()


def test_an_exception_while_writing_leaves_no_step_and_no_tmp(tmp_path: Path) -> None:
    writer = BundleWriter(tmp_path, RUN)
    with pytest.raises(RuntimeError, match="inventory"):
        with writer.begin(7) as pending:
            (pending.path / "x").write_bytes(b"x")
            raise RuntimeError("inventory mismatch")
    assert sorted(os.listdir(tmp_path / RUN)) == []


def test_a_bad_extra_value_fails_the_commit_naming_the_field(tmp_path: Path) -> None:
    pending = BundleWriter(tmp_path, RUN).begin(1)
    (pending.path / "a").write_bytes(b"a")
    with pytest.raises(DigestError, match=r"^loader\.rng: nan"):
        pending.commit(1, "c", "d", "authoritative", extra={"loader": {"rng": float("nan")}})
    assert sorted(os.listdir(tmp_path / RUN)) == []
    with pytest.raises(RuntimeError, match="already aborted"):
        pending.commit(1, "c", "d", "authoritative")


def test_links_and_foreign_manifests_are_refused_at_commit(tmp_path: Path) -> None:
    writer = BundleWriter(tmp_path, RUN)
    pending = writer.begin(1)
    (pending.path / "real").write_bytes(b"a")
    os.symlink(pending.path / "real", pending.path / "link")
    with pytest.raises(CheckpointCorrupt, match="link: not a regular file"):
        pending.commit(1, "c", "d", "authoritative")
    pending = writer.begin(1)
    (pending.path / MANIFEST).write_bytes(b"{}")
    with pytest.raises(CheckpointCorrupt, match=r"manifest\.json is reserved"):
        pending.commit(1, "c", "d", "authoritative")
    assert not (tmp_path / RUN / "step_1").exists()


def test_a_resave_of_an_existing_step_replaces_it_and_leaves_no_old_dir(tmp_path: Path) -> None:
    save(tmp_path, 2, contents(2, "old"))
    path = save(tmp_path, 2, contents(2, "new"), attempt=3)
    m = verify(path)
    assert m.attempt == 3
    assert (path / REPLAY_METADATA).read_bytes() == b"index 2new"
    assert sorted(os.listdir(tmp_path / RUN)) == ["step_2"]


def test_an_interrupted_resave_keeps_the_previous_step_discoverable_and_begin_restores_it(tmp_path: Path) -> None:
    save(tmp_path, 1)
    save(tmp_path, 2, contents(2, "old"))
    run = tmp_path / RUN
    # The state between the two renames of a re-save: old_step_2 and a complete tmp_step_2, no step_2.
    os.rename(run / "step_2", run / "old_step_2")
    (run / "tmp_step_2").mkdir()
    d = discover(tmp_path, RUN)
    assert d.chosen is not None and d.chosen.manifest.step == 2
    assert d.chosen.path == run / "old_step_2"
    BundleWriter(tmp_path, RUN).begin(3).abort()
    assert sorted(os.listdir(run)) == ["step_1", "step_2"]
    assert verify(run / "step_2").step == 2


def test_an_old_dir_next_to_its_step_is_a_leftover_and_is_skipped(tmp_path: Path) -> None:
    save(tmp_path, 2)
    run = tmp_path / RUN
    (run / "old_step_2").mkdir()
    d = discover(tmp_path, RUN)
    assert d.chosen is not None and d.chosen.path == run / "step_2"
    assert (run / "old_step_2", "leftover of a re-save (step_N exists)") in d.skipped
    BundleWriter(tmp_path, RUN).begin(3).abort()
    assert sorted(os.listdir(run)) == ["step_2"]


def test_the_commit_hashes_a_lone_big_file_on_every_thread_and_small_ones_on_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(commit, "_SPLIT_HASH_BYTES", 1024)  # "big" without writing 16 MiB
    monkeypatch.setattr(commit, "_HASH_WORKERS", 2)
    calls: list[tuple[str, int]] = []
    real = files.hash_file

    def spy(path: Path, algorithm: str = "blake3", *, threads: int = 1) -> FileEntry:
        calls.append((path.name, threads))
        return real(path, algorithm, threads=threads)

    monkeypatch.setattr(files, "hash_file", spy)
    big = os.urandom(5000)
    path = save(tmp_path, 1, {"policy/model.pt": big, REPLAY_METADATA: b"index"})
    assert calls[0] == ("model.pt", 2) and ("replay_buffer_metadata.pt", 1) in calls  # largest first
    assert verify(path).files["policy/model.pt"] == FileEntry(size=len(big), digest=blake3.blake3(big).hexdigest())
