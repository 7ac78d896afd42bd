"""The storage-unit snapshot format (column_file): round trip, refusals, restored rows made on first read. No Ray."""

from __future__ import annotations

import gc
import pickle
from pathlib import Path

import blake3
import pytest
import torch

from support.unit_rows import assert_same_rows, put_rows, unit_state
from trainingrun_runtime.dataplane import column_file
from trainingrun_runtime.errors import CheckpointCorrupt


def test_rows_round_trip_with_their_dtypes_shapes_and_indexes(tmp_path: Path) -> None:
    state = unit_state()
    written = column_file.write(tmp_path / "su", state).result()
    loaded = column_file.read(tmp_path / "su")
    assert (loaded.storage_unit_id, loaded.storage_unit_size) == (state.storage_unit_id, None)
    assert loaded.active_keys == state.active_keys
    assert_same_rows(state.field_data, loaded.field_data)
    assert written.size == (tmp_path / "su").stat().st_size


def test_the_digest_computed_from_memory_is_the_files_blake3(tmp_path: Path) -> None:
    written = column_file.write(tmp_path / "su", unit_state()).result()
    assert written.digest == blake3.blake3((tmp_path / "su").read_bytes()).hexdigest()


def test_planning_a_column_leaves_the_garbage_collector_nothing_to_do(tmp_path: Path) -> None:
    """Objects kept per row set off the collector's passes (over the unit's whole heap, in the window): 28 of them
    for these 10,000 rows when the plan kept a tuple per row."""
    rows = {**put_rows(5000, 8, torch.float32, 0), **put_rows(5000, 8, torch.float32, 5000)}
    state = column_file.UnitState("u", None, {"x": rows}, set(rows))
    passes: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            passes.append(info["generation"])

    gc.collect()
    gc.callbacks.append(count)
    try:
        pending = column_file.write(tmp_path / "su", state)
    finally:
        gc.callbacks.remove(count)
    assert pending.result().size == (tmp_path / "su").stat().st_size
    assert_same_rows(state.field_data, column_file.read(tmp_path / "su").field_data)
    assert len(passes) <= 1, passes


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
    with pytest.raises(
        CheckpointCorrupt, match=rf"{old}: not a storage-unit snapshot of format 2 .* older trainingrun"
    ):
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
