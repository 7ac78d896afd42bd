"""Verification and discovery: only listed, checksummed files are handed out; a corrupt step is refused naming the
file and the problem, and discovery falls back to the previous one. Bundles of format 1 (a SHA-256 per file,
written before BLAKE3) verify and are refused alike, the one an earlier version wrote included."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import blake3
import pytest

from support.bundles import RUN, T0, as_format_1, contents, resign, save
from trainingrun_runtime.errors import CheckpointCorrupt, DigestError
from trainingrun_runtime.storage import files, verification
from trainingrun_runtime.storage.commit import BundleWriter
from trainingrun_runtime.storage.layout import DATA_PLANE, MANIFEST, REPLAY_METADATA
from trainingrun_runtime.storage.manifest import FileEntry
from trainingrun_runtime.storage.verification import discover, open_verified, verify


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


@pytest.mark.parametrize("fmt", [2, 1], ids=["format-2", "format-1"])
@pytest.mark.parametrize("corrupt", list(CORRUPTIONS.values()), ids=list(CORRUPTIONS))
def test_a_corrupt_checkpoint_is_refused_naming_file_and_problem_and_discovery_falls_back(
    tmp_path: Path, corrupt: Callable[[Path], str], fmt: int
) -> None:
    older, newest = save(tmp_path, 1), save(tmp_path, 2)
    if fmt == 1:
        as_format_1(older), as_format_1(newest)
    expected = corrupt(newest)
    with pytest.raises(CheckpointCorrupt) as info:
        open_verified(newest)
    assert str(info.value).startswith(expected), str(info.value)
    d = discover(tmp_path, RUN)
    assert d.chosen is not None and d.chosen.manifest.step == 1
    assert d.chosen.path == tmp_path / RUN / "step_1" and d.chosen.manifest.format_version == fmt
    assert d.skipped == [(newest, str(info.value))]


def test_a_format_1_bundle_verifies_against_its_sha256_per_file(tmp_path: Path) -> None:
    path = as_format_1(save(tmp_path, 3))
    m = verify(path)
    assert m.format_version == 1
    assert {e.algorithm for e in m.files.values()} == {"sha256"}
    assert open_verified(path).replay_metadata == path / REPLAY_METADATA


def test_a_flipped_byte_in_a_format_1_bundle_is_a_sha256_mismatch(tmp_path: Path) -> None:
    path = as_format_1(save(tmp_path, 3))
    expected = _flip_byte(path)
    with pytest.raises(CheckpointCorrupt, match=r"checksum mismatch \(sha256 [0-9a-f]{64}, manifest says") as info:
        verify(path)
    assert str(info.value).startswith(expected)


def test_the_format_1_bundle_an_earlier_version_wrote_verifies(tmp_path: Path) -> None:
    """`tests/fixtures/bundle-format-1` (written by main at 58dd19e; `test_restore_compat` restores and trains on
    it): every SHA-256 checks out, without Ray."""
    fixture = Path(__file__).resolve().parents[3] / "fixtures" / "bundle-format-1" / "compat" / "step_2"
    m = verify(fixture)
    assert (m.format_version, m.run, m.step) == (1, "compat", 2)
    assert len(m.files) > 5 and {e.algorithm for e in m.files.values()} == {"sha256"}


def test_discovery_over_a_run_upgraded_mid_way_falls_back_from_format_2_to_format_1(tmp_path: Path) -> None:
    as_format_1(save(tmp_path, 1))  # written before the upgrade
    newest = save(tmp_path, 2)
    _flip_byte(newest)
    d = discover(tmp_path, RUN)
    assert d.chosen is not None and (d.chosen.manifest.step, d.chosen.manifest.format_version) == (1, 1)
    assert [p for p, _ in d.skipped] == [newest]
    assert verify(save(tmp_path, 3)).format_version == 2  # and the next save is format 2 again


def test_verification_reads_the_largest_files_first_each_in_the_manifests_algorithm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """So a big policy file does not queue behind the small ones (one worker here: the order is what it takes)."""
    path = as_format_1(save(tmp_path, 1))
    monkeypatch.setattr(verification, "_HASH_WORKERS", 1)
    read: list[tuple[str, str]] = []
    real = files.open_checked

    def spy(p: Path, want: FileEntry) -> BinaryIO:
        read.append((Path(p).relative_to(path).as_posix(), want.algorithm))
        return real(p, want)

    monkeypatch.setattr(files, "open_checked", spy)
    verify(path)
    by_size = sorted(contents(1), key=lambda rel: (-len(contents(1)[rel]), rel))
    assert read == [(rel, "sha256") for rel in by_size]
    assert by_size[0] == f"{DATA_PLANE}/storage_0.pkl" and by_size[1] == "policy/weights.pt"


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


def test_a_commit_reports_the_blake3_of_the_manifest_it_wrote_and_verification_finds_the_same(tmp_path: Path) -> None:
    pending = BundleWriter(tmp_path, RUN, now=lambda: T0).begin(3)
    (pending.path / "weights.pt").write_bytes(b"w" * 100)
    assert pending.manifest_blake3 is None
    path = pending.commit(attempt=1, config_hash="c" * 64, replay_digest="d" * 64, replay_mode="authoritative")
    written = blake3.blake3((path / MANIFEST).read_bytes()).hexdigest()  # hashed here, not by the code under test
    assert pending.manifest_blake3 == written
    assert open_verified(path, manifest_blake3=written).manifest_blake3 == written
    assert open_verified(path).manifest_blake3 == written


def test_a_re_signed_step_verifies_alone_but_not_against_the_manifest_blake3_recorded_at_its_commit(
    tmp_path: Path,
) -> None:
    path = save(tmp_path, 3)
    recorded = blake3.blake3((path / MANIFEST).read_bytes()).hexdigest()
    (path / "policy/weights.pt").write_bytes(b"someone else's weights" * 10)
    resign(path)  # what anyone who can write the volume can do
    verify(path)  # every checksum holds: the manifest alone proves nothing
    with pytest.raises(
        CheckpointCorrupt, match=rf"manifest.json: BLAKE3 [0-9a-f]{{64}}, but the run's status recorded {recorded}"
    ):
        verify(path, manifest_blake3=recorded)
    with pytest.raises(CheckpointCorrupt, match="rewritten or replaced"):
        open_verified(path, manifest_blake3=recorded)


def test_the_recorded_manifest_blake3_is_checked_before_the_manifest_is_parsed(tmp_path: Path) -> None:
    path = save(tmp_path, 3)
    (path / MANIFEST).write_bytes(b"not json")
    with pytest.raises(CheckpointCorrupt, match="BLAKE3"):
        verify(path, manifest_blake3="0" * 64)


def test_a_file_renamed_over_a_checked_one_is_never_what_its_reader_reads(tmp_path: Path) -> None:
    """The reader gets the descriptor the check read through: a file swapped in by rename afterwards (a writer
    of the volume replacing a verified file between the check and the load) is not read."""
    path = save(tmp_path, 3)
    verified = open_verified(path)
    with verified.open(REPLAY_METADATA) as f:
        (path / "swap").write_bytes(b"tampered after the check")
        os.replace(path / "swap", path / REPLAY_METADATA)
        assert f.read() == contents(3)[REPLAY_METADATA]


def test_a_file_swapped_after_verification_is_refused_when_it_is_opened_for_reading(tmp_path: Path) -> None:
    """`open_verified` checked every file; one replaced after that (another valid-looking file of the same size)
    is refused by the reader's own check rather than loaded."""
    path = save(tmp_path, 3)
    verified = open_verified(path)
    original = contents(3)[REPLAY_METADATA]
    (path / "swap").write_bytes(bytes(b ^ 0xFF for b in original))
    os.replace(path / "swap", path / REPLAY_METADATA)
    with pytest.raises(CheckpointCorrupt, match=rf"{REPLAY_METADATA}: checksum mismatch"):
        verified.open(REPLAY_METADATA)


def test_a_symbolic_link_in_place_of_a_listed_file_is_refused_without_being_followed(tmp_path: Path) -> None:
    path = save(tmp_path, 3)
    target = tmp_path / "elsewhere"
    target.write_bytes(contents(3)[REPLAY_METADATA])  # the right bytes, but not the bundle's file
    (path / REPLAY_METADATA).unlink()
    (path / REPLAY_METADATA).symlink_to(target)
    entry = files.hash_file(target)
    with pytest.raises(CheckpointCorrupt, match="a symbolic link, which a bundle never holds"):
        files.open_checked(path / REPLAY_METADATA, entry)


def test_the_entries_of_a_folder_are_keyed_by_their_path_inside_it(tmp_path: Path) -> None:
    verified = open_verified(save(tmp_path, 3))
    policy = verified.entries("policy")
    assert set(policy) == {rel.removeprefix("policy/") for rel in contents(3) if rel.startswith("policy/")}
    assert all(policy[name] == verified.manifest.files[f"policy/{name}"] for name in policy)
