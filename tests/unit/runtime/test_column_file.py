"""The storage-unit snapshot format (column_file): round trip, digest from memory, refusals. No Ray."""

from __future__ import annotations

import os
import hashlib
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch

from trainingrun_runtime.dataplane import column_file
from trainingrun_runtime.errors import CheckpointCorrupt


def put_rows(n: int, width: int, dtype: torch.dtype, first: int) -> dict[int, torch.Tensor]:
    """Rows as TransferQueue's SimpleStorage keeps them: views into one put buffer."""
    buffer = torch.arange(n * width).to(dtype).reshape(n, width)
    return dict(zip(range(first, first + n), buffer.unbind(0), strict=True))


def unit_state() -> column_file.UnitState:
    tokens = {**put_rows(4, 16, torch.int64, 0), **put_rows(3, 16, torch.int64, 10)}  # two puts
    return column_file.UnitState(
        storage_unit_id="TQ_STORAGE_UNIT_test",
        storage_unit_size=None,
        field_data={
            "tokens": tokens,
            "reward": {gi: torch.tensor(float(gi)) for gi in tokens},  # 0-dim rows
            "response": {gi: torch.arange(gi % 3 + 1, dtype=torch.int16) for gi in tokens},  # jagged
            "mixed": {0: torch.ones(3, dtype=torch.uint8), 1: torch.ones(2, dtype=torch.float64)},  # alignment
            "text": {gi: f"row {gi}" for gi in tokens},  # not tensors: pickled
            "strided": {0: torch.arange(12).reshape(3, 4).t()},  # non-contiguous
            "empty": {},
        },
        active_keys=set(tokens),
    )


def assert_same_rows(a: dict[str, dict[int, Any]], b: dict[str, dict[int, Any]]) -> None:
    assert a.keys() - {"empty"} == b.keys() - {"empty"}
    for name, rows in a.items():
        got = b.get(name, {})
        assert list(rows) == list(got), name
        for gi, value in rows.items():
            if isinstance(value, torch.Tensor):
                assert got[gi].dtype == value.dtype and got[gi].shape == value.shape, (name, gi)
                assert torch.equal(got[gi], value), (name, gi)
            else:
                assert got[gi] == value, (name, gi)


def test_rows_round_trip_with_their_dtypes_shapes_and_indexes(tmp_path: Path) -> None:
    state = unit_state()
    written = column_file.write(tmp_path / "su", state).result()
    loaded = column_file.read(tmp_path / "su")
    assert (loaded.storage_unit_id, loaded.storage_unit_size) == (state.storage_unit_id, None)
    assert loaded.active_keys == state.active_keys
    assert_same_rows(state.field_data, loaded.field_data)
    assert written.size == (tmp_path / "su").stat().st_size


def test_the_digest_computed_from_memory_is_the_files_sha256(tmp_path: Path) -> None:
    written = column_file.write(tmp_path / "su", unit_state()).result()
    assert written.sha256 == hashlib.sha256((tmp_path / "su").read_bytes()).hexdigest()


def test_the_file_holds_each_rows_own_bytes_once_not_the_put_buffer(tmp_path: Path) -> None:
    buffer = torch.zeros(256, 1024, dtype=torch.float32)
    rows = dict(enumerate(buffer.unbind(0)))
    live = {gi: rows[gi] for gi in range(0, 256, 64)}  # 4 rows left of a 256-row put
    state = column_file.UnitState("u", None, {"x": live}, set(live))
    written = column_file.write(tmp_path / "su", state).result()
    assert written.size < 4 * 1024 * 4 + 4096


def test_loaded_rows_are_views_into_one_buffer(tmp_path: Path) -> None:
    column_file.write(tmp_path / "su", unit_state()).result()
    tokens = column_file.read(tmp_path / "su").field_data["tokens"]
    storages = {t.untyped_storage().data_ptr() for t in tokens.values()}
    assert len(storages) == 1


def test_a_format_1_pickle_is_refused_naming_the_file_and_the_fix(tmp_path: Path) -> None:
    old = tmp_path / "su_0_TQ_STORAGE_UNIT_old.pkl"
    old.write_bytes(pickle.dumps({"storage_unit_id": "x", "field_data": {}, "active_keys": set()}, protocol=5))
    with pytest.raises(CheckpointCorrupt, match=rf"{old}: not a storage-unit snapshot of format 2 .* older trainingrun"):
        column_file.read(old)


@pytest.mark.parametrize("cut", [10, 1000, 5])
def test_a_truncated_file_is_refused_naming_the_file(tmp_path: Path, cut: int) -> None:
    path = tmp_path / "su"
    column_file.write(path, unit_state()).result()
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) - cut] if cut != 5 else raw[:5])
    with pytest.raises(CheckpointCorrupt, match=rf"{path}: "):
        column_file.read(path)


def test_an_existing_file_is_never_overwritten(tmp_path: Path) -> None:
    (tmp_path / "su").write_bytes(b"keep")
    with pytest.raises(FileExistsError):
        column_file.write(tmp_path / "su", unit_state())
    assert (tmp_path / "su").read_bytes() == b"keep"


def test_loaded_rows_outlive_the_unlinked_file(tmp_path: Path) -> None:
    rows = put_rows(640, 1024, torch.int64, 0)  # 5 MiB, mapped from the file
    state = column_file.UnitState("u", 7, {"tokens": rows}, set(rows))
    column_file.write(tmp_path / "su", state).result()
    loaded = column_file.read(tmp_path / "su")
    (tmp_path / "su").unlink()
    assert loaded.storage_unit_size == 7
    assert_same_rows(state.field_data, loaded.field_data)


def test_writing_a_loaded_row_in_place_never_changes_the_file(tmp_path: Path) -> None:
    state = unit_state()
    column_file.write(tmp_path / "su", state).result()
    before = (tmp_path / "su").read_bytes()
    loaded = column_file.read(tmp_path / "su")
    loaded.field_data["tokens"][0].fill_(-1)
    assert (tmp_path / "su").read_bytes() == before
    assert_same_rows(state.field_data, column_file.read(tmp_path / "su").field_data)


def test_a_unit_with_no_rows_round_trips(tmp_path: Path) -> None:
    state = column_file.UnitState("u", None, {}, set())
    column_file.write(tmp_path / "su", state).result()
    loaded = column_file.read(tmp_path / "su")
    assert (loaded.field_data, loaded.active_keys) == ({}, set())


def big_state(rows: int = 1200) -> column_file.UnitState:
    """About 9.4 MiB over three staging buffers, ending in a tail that is not a multiple of 4096 bytes."""
    tokens = put_rows(rows, 1024, torch.int64, 0)
    reward = {gi: torch.tensor(float(gi)) for gi in tokens}
    return column_file.UnitState("u", None, {"tokens": tokens, "reward": reward}, set(tokens))


@pytest.mark.parametrize("direct", [True, False], ids=["o_direct", "buffered"])
def test_a_file_of_several_staging_buffers_round_trips_with_the_sha256_of_its_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct: bool
) -> None:
    if not direct:
        monkeypatch.delattr(os, "O_DIRECT", raising=False)  # as on a platform without it
    state = big_state()
    written = column_file.write(tmp_path / "su", state).result()
    raw = (tmp_path / "su").read_bytes()
    assert len(raw) == written.size and written.size % 4096 != 0
    assert written.sha256 == hashlib.sha256(raw).hexdigest()
    assert_same_rows(state.field_data, column_file.read(tmp_path / "su").field_data)


def test_a_filesystem_that_refuses_o_direct_gets_the_same_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
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
    assert written.sha256 == hashlib.sha256((tmp_path / "su").read_bytes()).hexdigest()
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


def test_a_restored_field_makes_a_rows_view_only_when_the_row_is_read(tmp_path: Path) -> None:
    column_file.write(tmp_path / "su", unit_state()).result()
    tokens = column_file.read(tmp_path / "su").field_data["tokens"]
    assert isinstance(tokens, column_file.RestoredRows)
    assert {row for _, row in tokens.raw_items()} == {column_file.UNREAD}
    first = tokens[10]
    assert first is tokens[10]  # made once, then kept, as a dict keeps its values
    assert [gi for gi, row in tokens.raw_items() if row is not column_file.UNREAD] == [10]
    assert first.untyped_storage().data_ptr() == tokens.column.untyped_storage().data_ptr()


def test_restored_rows_take_puts_overwrites_and_clears_as_a_dict_does(tmp_path: Path) -> None:
    """TransferQueue's StorageUnitData reads `[gi]`, puts and overwrites with `[gi] = row`, clears with
    `pop(gi, None)`; the restored field must answer every one of them as the dict it replaces."""
    state = unit_state()
    column_file.write(tmp_path / "su", state).result()
    restored = column_file.read(tmp_path / "su").field_data["tokens"]
    plain = dict(state.field_data["tokens"])
    new_row = torch.full((16,), 7, dtype=torch.int64)
    for rows in (restored, plain):
        rows[1] = new_row  # the advantage stage overwrites a stored row
        rows[99] = new_row  # a later put adds one
        assert rows.pop(2, None) is not None and rows.pop(2, None) is None  # cleared once, then gone
        del rows[11]
        with pytest.raises(KeyError):
            rows[11]
        with pytest.raises(KeyError):
            rows.pop(11)
    assert list(restored) == list(plain) and len(restored) == len(plain)
    assert 99 in restored and 2 not in restored
    assert all(torch.equal(restored[gi], plain[gi]) for gi in plain)
    assert restored[1] is new_row


def test_a_save_right_after_a_restore_writes_unread_rows_from_the_mapping(tmp_path: Path) -> None:
    state = unit_state()
    column_file.write(tmp_path / "a", state).result()
    restored = column_file.read(tmp_path / "a")
    tokens = restored.field_data["tokens"]
    assert isinstance(tokens, column_file.RestoredRows)
    tokens[3] = torch.full((16,), -3, dtype=torch.int64)  # overwritten; the other rows are never read
    tokens.pop(12)
    expected = {name: dict(rows.items()) for name, rows in state.field_data.items()}
    expected["tokens"][3] = tokens[3]
    del expected["tokens"][12]
    column_file.write(tmp_path / "b", restored).result()
    assert [gi for gi, row in tokens.raw_items() if row is column_file.UNREAD] == [0, 1, 2, 10, 11]  # no views made
    assert_same_rows(expected, column_file.read(tmp_path / "b").field_data)


def test_a_header_listing_a_row_twice_is_refused_naming_the_file_and_the_field(tmp_path: Path) -> None:
    path = tmp_path / "su"
    column_file.write(path, unit_state()).result()
    raw = path.read_bytes()
    listed = b'"name":"tokens","indexes":[0,1,2,3,10,11,12]'
    assert raw.count(listed) == 1
    path.write_bytes(raw.replace(listed, listed.replace(b"10,11", b"11,11")))  # same length, same layout
    with pytest.raises(CheckpointCorrupt, match=rf"{path}: field 'tokens' lists a row twice"):
        column_file.read(path)
