"""The storage-unit snapshot format (column_file): round trip, refusals, restored rows made on first read. No Ray."""

from __future__ import annotations

import gc
import json
import os
import pickle
import struct
from pathlib import Path
from typing import Any

import blake3
import pytest
import torch

from support.unit_rows import assert_same_rows, put_rows, unit_state
from trainingrun_runtime.dataplane import column_file
from trainingrun_runtime.errors import CheckpointCorrupt, UnstorableValue

FIXTURE_UNIT = (
    Path(__file__).resolve().parents[3]
    / "fixtures/bundle-format-1/compat/step_2/data_plane/simple_storage/su_0_TQ_STORAGE_UNIT_ca5181d3.pkl"
)


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
        CheckpointCorrupt,
        match=rf"{old}: not a storage-unit snapshot of format {column_file.FORMAT} .* older trainingrun",
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


class _TouchMarker:
    """Unpickling this creates the marker file (through os.system): proof that a pickle ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def _file_with_section(path: Path, magic: bytes, section: bytes) -> None:
    """A column file with no columns whose other-rows section is `section` (as a format 2 or 3 writer lays it)."""
    header = {
        "format": magic[-1],
        "storage_unit_id": "u",
        "storage_unit_size": None,
        "active_keys": [0],
        "fields": [],
        "others": {"offset": 0, "nbytes": len(section)},
        "data_nbytes": len(section),
    }
    head = json.dumps(header).encode()
    prefix = struct.pack("<8sQ", magic, len(head)) + head
    path.write_bytes(prefix + bytes(-len(prefix) % 64) + section)


def test_rows_that_are_not_tensors_are_stored_as_json_not_as_a_pickle(tmp_path: Path) -> None:
    state = unit_state()
    column_file.write(tmp_path / "su", state).result()
    raw = (tmp_path / "su").read_bytes()
    assert raw[:8] == column_file.MAGIC == b"TRCOLS\x00\x03"
    (head_len,) = struct.unpack("<Q", raw[8:16])
    header = json.loads(raw[16 : 16 + head_len])
    start = -(-(16 + head_len) // 64) * 64 + header["others"]["offset"]
    section = json.loads(raw[start : start + header["others"]["nbytes"]])
    assert section == {"text": [[gi, f"row {gi}"] for gi in state.field_data["text"]]}
    assert_same_rows(state.field_data, column_file.read(tmp_path / "su").field_data)


def test_a_format_2_file_without_pickled_rows_is_read(tmp_path: Path) -> None:
    loaded = column_file.read(FIXTURE_UNIT)  # written by main at 58dd19e: every row a dense tensor
    assert FIXTURE_UNIT.read_bytes()[:8] == b"TRCOLS\x00\x02"
    assert loaded.active_keys == {0, 2, 4, 6}
    assert loaded.field_data["tokens"][2].shape == (6,) and loaded.field_data["rewards"][6].dtype == torch.float32
    column_file.write(tmp_path / "again", loaded).result()  # saved again in format 3, the same rows
    assert_same_rows(dict(loaded.field_data), dict(column_file.read(tmp_path / "again").field_data))


def test_a_format_2_file_with_pickled_rows_is_refused_naming_the_fix_and_never_unpickled(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    payload = pickle.dumps({"text": {0: _TouchMarker(marker)}}, protocol=5)
    pickle.loads(pickle.dumps(_TouchMarker(marker)))  # proof that the payload does create the marker when unpickled
    assert marker.exists()
    marker.unlink()
    path = tmp_path / "su_old"
    _file_with_section(path, b"TRCOLS\x00\x02", payload)
    with pytest.raises(CheckpointCorrupt) as refused:
        column_file.read(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: a storage-unit snapshot of format 2 ")
    assert (
        "are a pickle, which this trainingrun never loads" in message and "restore it with the trainingrun" in message
    )
    assert not marker.exists()


def test_a_pickle_in_the_rows_section_of_a_format_3_file_is_refused_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    pickle.loads(pickle.dumps(_TouchMarker(marker)))  # proof that the payload does create the marker when unpickled
    assert marker.exists()
    marker.unlink()
    path = tmp_path / "su"
    _file_with_section(path, column_file.MAGIC, pickle.dumps({"text": {0: _TouchMarker(marker)}}, protocol=5))
    with pytest.raises(CheckpointCorrupt, match=rf"{path}: unreadable rows section"):
        column_file.read(path)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("value", "type_name"),
    [
        (object(), "builtins.object"),
        ({1, 2}, "builtins.set"),
        (torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]), "torch.Tensor"),
        (torch.ones(2, device="meta"), "torch.Tensor"),
    ],
)
def test_a_value_the_format_cannot_hold_fails_the_save_naming_the_field_row_and_type(
    tmp_path: Path, value: object, type_name: str
) -> None:
    state = column_file.UnitState("u", None, {"odd": {7: value}, "x": {7: torch.ones(2)}}, {7})
    with pytest.raises(UnstorableValue, match=rf"field 'odd', row 7: a value of type {type_name}, "):
        column_file.write(tmp_path / "su", state)
    assert not (tmp_path / "su").exists()  # refused before the file is made
