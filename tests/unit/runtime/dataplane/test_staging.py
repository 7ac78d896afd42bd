"""The staged write of a unit file: several staging buffers, O_DIRECT or buffered, never past its final size, a
failed write raised and the buffers freed."""

from __future__ import annotations

import os
from pathlib import Path

import blake3
import pytest

from support.unit_rows import assert_same_rows, big_state
from trainingrun_runtime.dataplane import column_file


@pytest.mark.parametrize("direct", [True, False], ids=["o_direct", "buffered"])
def test_a_file_of_several_staging_buffers_round_trips_with_the_blake3_of_its_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct: bool
) -> None:
    if not direct:
        monkeypatch.delattr(os, "O_DIRECT", raising=False)  # as on a platform without it
    state = big_state()
    written = column_file.write(tmp_path / "su", state).result()
    raw = (tmp_path / "su").read_bytes()
    assert len(raw) == written.size and written.size % 4096 != 0
    assert written.digest == blake3.blake3(raw).hexdigest()
    assert_same_rows(state.field_data, column_file.read(tmp_path / "su").field_data)


def test_a_filesystem_that_refuses_o_direct_gets_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every local filesystem here accepts O_DIRECT (tmpfs too, since Linux 6.6): `os.open` stands in for one that
    refuses it, as older tmpfs and some network filesystems do, with EINVAL."""
    import errno

    real_open = os.open

    def refusing(path: str, flags: int, *args: int) -> int:
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", refusing)
    state = big_state(300)
    written = column_file.write(tmp_path / "su", state).result()
    assert written.digest == blake3.blake3((tmp_path / "su").read_bytes()).hexdigest()
    assert_same_rows(state.field_data, column_file.read(tmp_path / "su").field_data)


def test_the_file_never_grows_past_its_final_size_while_it_is_written(tmp_path: Path) -> None:
    pending = column_file.write(tmp_path / "su", big_state())
    sizes = set()
    while pending._thread.is_alive():  # the snapshot lists the size as soon as write() returns
        sizes.add((tmp_path / "su").stat().st_size)
    written = pending.result()
    assert sizes <= {written.size} and (tmp_path / "su").stat().st_size == written.size


def test_a_failed_write_is_raised_by_result_and_frees_the_staging_buffers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk cannot be made here: `os.pwrite` is replaced by one that fails as a full disk does."""
    import errno

    def full(fd: int, data: object, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(OSError, match="No space left"):
        column_file.write(tmp_path / "su", big_state()).result(timeout=30)
    monkeypatch.undo()
    assert column_file.write(tmp_path / "again", big_state()).result(timeout=30).size > 0
