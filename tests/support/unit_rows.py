"""Storage-unit rows as TransferQueue's SimpleStorage keeps them, for the column-file and staging tests. No Ray."""

from __future__ import annotations

from typing import Any

import torch

from trainingrun_runtime.dataplane import column_file


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
            "text": {gi: f"row {gi}" for gi in tokens},  # not tensors: tagged JSON (row_values)
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


def big_state(rows: int = 1200) -> column_file.UnitState:
    """About 9.4 MiB over three staging buffers, ending in a tail that is not a multiple of 4096 bytes."""
    tokens = put_rows(rows, 1024, torch.int64, 0)
    reward = {gi: torch.tensor(float(gi)) for gi in tokens}
    return column_file.UnitState("u", None, {"tokens": tokens, "reward": reward}, set(tokens))
