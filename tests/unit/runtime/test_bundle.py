"""Checkpoint bundle: manifest round trip, commit order, re-save, verify, discovery and the corruption matrix."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from trainingrun_runtime.storage import commit, files, layout, manifest, verification
from trainingrun_runtime.storage.commit import BundleWriter
from trainingrun_runtime.storage.layout import DATA_PLANE, MANIFEST, REPLAY_METADATA
from trainingrun_runtime.storage.manifest import Manifest
from trainingrun_runtime.storage.verification import discover, open_verified, verify
from trainingrun_runtime.digest import sha256_hex
from trainingrun_runtime.errors import CheckpointCorrupt, DigestError

RUN = "demo"
T0 = datetime.datetime(2025, 1, 2, 3, 4, 5, 678000, tzinfo=datetime.timezone.utc)


def contents(step: int, tag: str = "") -> dict[str, bytes]:
    return {
        f"{DATA_PLANE}/storage_0.pkl": f"rows of step {step}{tag}".encode() * 100,
        f"{DATA_PLANE}/controller.pkl": f"controller {step}{tag}".encode(),
        REPLAY_METADATA: f"index {step}{tag}".encode(),
        "policy/weights.pt": bytes(range(256)) * 4,
        "train_dataloader.pt": b"loader",
    }


def save(
    root: Path,
    step: int,
    files: dict[str, bytes] | None = None,
    *,
    on_stage: Callable[[str], None] | None = None,
    attempt: int = 1,
) -> Path:
    writer = BundleWriter(root, RUN, on_stage=on_stage, now=lambda: T0)
    pending = writer.begin(step)
    for rel, data in (files if files is not None else contents(step)).items():
        p = pending.path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return pending.commit(
        attempt=attempt,
        config_hash="c" * 64,
        replay_digest=sha256_hex({"step": step}),
        replay_mode="authoritative",
        weights_sha256="w" * 3,
        extra={"loader": {"epoch": 0, "index": step}},
    )


def sample_manifest() -> Manifest:
    return Manifest(
        format_version=manifest.FORMAT_VERSION,
        run=RUN,
        step=3,
        attempt=2,
        config_hash="abc",
        created="2025-01-02T03:04:05.678Z",
        files={"data_plane/a": {"size": 3, "sha256": "0" * 64}},
        replay_digest="d" * 64,
        replay_mode="authoritative",
        weights_sha256=None,
        extra={"k": [1, 2]},
    )


# -- manifest ------------------------------------------------------------------------------------------


def test_a_manifest_survives_a_round_trip_through_json() -> None:
    m = sample_manifest()
    assert Manifest.from_json(m.to_json()) == m
    assert json.loads(m.to_json())["weights_sha256"] is None


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (lambda d: d.pop("replay_digest"), "required key 'replay_digest' is missing"),
        (lambda d: d.update(step="3"), "'step' must be int"),
        (lambda d: d.update(step=True), "'step' must be int"),
        (lambda d: d.update(format_version=99), "format_version 99 is not supported"),
        (lambda d: d.update(surprise=1), "unknown manifest keys ['surprise']"),
        (lambda d: d.update(files={"../etc/passwd": {"size": 1, "sha256": "0" * 64}}), "unsafe or reserved path"),
        (lambda d: d.update(files={"manifest.json": {"size": 1, "sha256": "0" * 64}}), "unsafe or reserved path"),
        (lambda d: d.update(files={"a": {"size": -1, "sha256": "0" * 64}}), "invalid size or sha256"),
        (lambda d: d.update(files={"a": {"size": 1, "sha256": "xyz"}}), "invalid size or sha256"),
        (lambda d: d.update(weights_sha256=5), "weights_sha256 must be a string or null"),
        (lambda d: d.pop("weights_sha256"), "required key 'weights_sha256' is missing"),
        (lambda d: d.pop("extra"), "required key 'extra' is missing"),
        (lambda d: d.update(files=[]), "'files' must be dict"),
    ],
)
def test_an_invalid_manifest_is_refused_naming_the_key(mutate: Callable[[dict[str, object]], object], problem: str) -> None:
    d = sample_manifest().to_dict()
    mutate(d)
    with pytest.raises(CheckpointCorrupt) as info:
        Manifest.from_json(json.dumps(d).encode(), where="x/manifest.json")
    assert str(info.value).startswith("x/manifest.json: ")
    assert problem in str(info.value)


def test_a_manifest_with_nan_is_not_valid_json() -> None:
    raw = sample_manifest().to_json().replace(b'"extra": {', b'"extra": {"x": NaN, ')
    with pytest.raises(CheckpointCorrupt, match="not valid JSON"):
        Manifest.from_json(raw)


# -- commit --------------------------------------------------------------------------------------------


def test_commit_lists_every_file_with_size_and_sha256_and_renames(tmp_path: Path) -> None:
    path = save(tmp_path, 4)
    assert path == tmp_path / RUN / "step_4"
    assert not (tmp_path / RUN / "tmp_step_4").exists()
    m = verify(path)
    written = contents(4)
    assert set(m.files) == set(written)
    for rel, data in written.items():
        assert m.files[rel]["size"] == len(data)
    assert m.files[REPLAY_METADATA]["sha256"] == files.hash_file(path / REPLAY_METADATA)["sha256"]
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
    with pytest.raises(CheckpointCorrupt, match="manifest.json is reserved"):
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


def test_run_names_and_steps_are_checked() -> None:
    with pytest.raises(ValueError, match="single path component"):
        BundleWriter("/tmp", "../escape")
    with pytest.raises(ValueError, match="non-negative int"):
        layout.step_dirname(-1)


# -- verify, open_verified, discovery -----------------------------------------------------------------


def test_open_for_restore_returns_only_listed_files(tmp_path: Path) -> None:
    path = save(tmp_path, 3)
    b = open_verified(path)
    assert b.manifest.step == 3
    assert b.replay_metadata == path / REPLAY_METADATA
    assert b.data_plane == path / DATA_PLANE
    assert b.file("policy/weights.pt") == path / "policy/weights.pt"
    with pytest.raises(CheckpointCorrupt, match="not in the manifest"):
        b.file("policy/other.pt")


def test_a_checkpoint_without_data_plane_files_cannot_hand_out_a_data_plane(tmp_path: Path) -> None:
    path = save(tmp_path, 3, {REPLAY_METADATA: b"i"})
    with pytest.raises(CheckpointCorrupt, match="data_plane: missing"):
        _ = open_verified(path).data_plane


def test_discovery_of_a_run_without_checkpoints_finds_nothing(tmp_path: Path) -> None:
    d = discover(tmp_path, RUN)
    assert d.chosen is None and d.skipped == []


def test_discovery_picks_the_newest_valid_step_numerically_and_ignores_other_entries(tmp_path: Path) -> None:
    for step in (2, 9, 10):
        save(tmp_path, step)
    run = tmp_path / RUN
    (run / "attempts" / "1").mkdir(parents=True)
    (run / "status.json").write_text("{}")
    d = discover(tmp_path, RUN)
    assert d.chosen is not None and d.chosen.manifest.step == 10
    assert d.chosen.path == run / "step_10"
    assert d.skipped == []


def test_discovery_runs_the_callers_check_on_verified_candidates_and_falls_back_on_its_refusal(
    tmp_path: Path,
) -> None:
    for step in (1, 2, 3):
        save(tmp_path, step)
    seen: list[int] = []

    def check(opened: verification.VerifiedBundle) -> str:
        seen.append(opened.manifest.step)
        if opened.manifest.step == 3:
            raise CheckpointCorrupt(f"{opened.path}: refused by the caller")
        if opened.manifest.step == 2:
            raise DigestError(f"{opened.path}: digest differs")
        return f"selected {opened.path.name}"

    d = discover(tmp_path, RUN, check=check, skip_on=(DigestError,))
    assert seen == [3, 2, 1] and d.checked == "selected step_1" and d.chosen is not None and d.chosen.manifest.step == 1
    assert [why for _, why in d.skipped] == [f"{tmp_path / RUN / 'step_3'}: refused by the caller",
                                             f"{tmp_path / RUN / 'step_2'}: digest differs"]  # fmt: skip
    assert d.candidates == 3


def test_a_check_error_that_older_steps_would_share_propagates_from_discovery(tmp_path: Path) -> None:
    save(tmp_path, 1)

    def check(opened: verification.VerifiedBundle) -> None:
        raise ValueError("partition differs from the configured one")

    with pytest.raises(ValueError, match="partition differs"):
        discover(tmp_path, RUN, check=check)


def _truncate(step_dir: Path) -> str:
    p = step_dir / DATA_PLANE / "storage_0.pkl"
    p.write_bytes(p.read_bytes()[:-7])
    return f"{p}: truncated"


def _flip_byte(step_dir: Path) -> str:
    p = step_dir / DATA_PLANE / "storage_0.pkl"
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x01
    p.write_bytes(bytes(data))
    return f"{p}: checksum mismatch"


def _remove_data_plane(step_dir: Path) -> str:
    import shutil

    shutil.rmtree(step_dir / DATA_PLANE)
    return f"{step_dir / DATA_PLANE}/controller.pkl: missing"


def _remove_manifest(step_dir: Path) -> str:
    (step_dir / MANIFEST).unlink()
    return f"{step_dir / MANIFEST}: missing"


def _manifest_not_json(step_dir: Path) -> str:
    p = step_dir / MANIFEST
    p.write_bytes(p.read_bytes()[:40])
    return f"{p}: not valid JSON"


def _manifest_wrong_step(step_dir: Path) -> str:
    p = step_dir / MANIFEST
    d = json.loads(p.read_bytes())
    d["step"] = 1
    p.write_text(json.dumps(d))
    return f"{p}: step is 1 but the directory is step_2"


def _unlisted_file(step_dir: Path) -> str:
    p = step_dir / DATA_PLANE / "stray.pkl"
    p.write_bytes(b"?")
    return f"{p}: not listed in the manifest"


def _sidecar_replaced(step_dir: Path) -> str:
    p = step_dir / REPLAY_METADATA
    p.write_bytes(b"index of another run")
    return f"{p}: size mismatch"


CORRUPTIONS = {
    "truncated storage file": _truncate,
    "flipped byte": _flip_byte,
    "missing data_plane": _remove_data_plane,
    "missing manifest": _remove_manifest,
    "manifest not JSON": _manifest_not_json,
    "manifest names another step": _manifest_wrong_step,
    "unlisted file": _unlisted_file,
    "replaced sidecar": _sidecar_replaced,
}


@pytest.mark.parametrize("corrupt", list(CORRUPTIONS.values()), ids=list(CORRUPTIONS))
def test_a_corrupt_checkpoint_is_refused_naming_file_and_problem_and_discovery_falls_back(
    tmp_path: Path, corrupt: Callable[[Path], str]
) -> None:
    save(tmp_path, 1)
    newest = save(tmp_path, 2)
    expected = corrupt(newest)
    with pytest.raises(CheckpointCorrupt) as info:
        open_verified(newest)
    assert str(info.value).startswith(expected), str(info.value)
    d = discover(tmp_path, RUN)
    assert d.chosen is not None and d.chosen.manifest.step == 1
    assert d.chosen.path == tmp_path / RUN / "step_1"
    assert d.skipped == [(newest, str(info.value))]


def test_a_leftover_tmp_step_is_never_a_checkpoint_and_discovery_says_why(tmp_path: Path) -> None:
    save(tmp_path, 1)
    run = tmp_path / RUN
    # A complete-looking save that was never renamed: data and manifest, still tmp_.
    save(tmp_path, 2)
    os.rename(run / "step_2", run / "tmp_step_2")
    with pytest.raises(CheckpointCorrupt, match="directory name is not step_N"):
        verify(run / "tmp_step_2")
    d = discover(tmp_path, RUN)
    assert d.chosen is not None and d.chosen.manifest.step == 1
    assert d.skipped == [(run / "tmp_step_2", "incomplete save (tmp_ directory never renamed)")]


def test_a_checkpoint_copied_under_another_run_is_refused(tmp_path: Path) -> None:
    path = save(tmp_path, 1)
    other = tmp_path / "other-run"
    other.mkdir()
    os.rename(path, other / "step_1")
    with pytest.raises(CheckpointCorrupt, match="run is 'demo', expected 'other-run'"):
        verify(other / "step_1")
    assert verify(other / "step_1", run=RUN).step == 1
    assert discover(tmp_path, "other-run").chosen is None


def test_hash_file_reads_large_files_in_chunks(tmp_path: Path) -> None:
    data = os.urandom(files.CHUNK * 2 + 12345)
    p = tmp_path / "big"
    p.write_bytes(data)
    assert files.hash_file(p) == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


@pytest.mark.parametrize("size", [0, 1, 4096, files.CHUNK - 1, files.CHUNK])
def test_hash_file_gives_size_and_sha256_of_small_and_boundary_sized_files(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    p = tmp_path / "f"
    p.write_bytes(data)
    assert files.hash_file(p) == {"size": size, "sha256": hashlib.sha256(data).hexdigest()}
    assert files.hash_file(p) == files.hash_file(p)  # a reused buffer carries nothing over
