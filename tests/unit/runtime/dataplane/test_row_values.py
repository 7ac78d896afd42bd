"""The JSON encoding of a storage unit's rows that are not dense tensors (row_values): exact round trip, refusals."""

from __future__ import annotations

import math
import pickle
from typing import Any

import numpy as np
import pytest
import torch

from trainingrun_runtime.dataplane import row_values
from trainingrun_runtime.errors import CheckpointCorrupt, UnstorableValue


def _same(a: Any, b: Any) -> bool:
    """Equal and of exactly the same types, all the way down (True == 1 and 1 == 1.0 would hide a changed type)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(k, j) and _same(a[k], b[j]) for k, j in zip(a, b, strict=True))
    return bool(a == b)


SUPPORTED: list[Any] = [
    None,
    True,
    False,
    0,
    -7,
    2**100,
    1.5,
    -0.0,
    0.1 + 0.2,
    math.nan,
    math.inf,
    -math.inf,
    "",
    "answer 3",
    'ünïcødé \n"quoted" {$tuple}',
    b"",
    b"\x00\xffbytes",
    [],
    [1, "a", None],
    (),
    (1, (2.0, "x")),
    {},
    {"a": 1, "b": [1, 2]},
    {1: "int key", (1, 2): "tuple key", None: True, "$tuple": "a key that looks like a tag"},
    {"$dict": [[1, 2]]},  # a dict that looks like an encoded one
    [{"nested": ({"deep": [b"x"]},)}],
    torch.arange(5, dtype=torch.int16),
    torch.tensor(3.5),  # 0-dim
    torch.ones(2, 3, dtype=torch.bfloat16),
    torch.tensor([True, False]),
    torch.empty(0, 4),
    torch.arange(12).reshape(3, 4).t(),  # non-contiguous: stored as its values
    [torch.zeros(2), torch.ones(1, dtype=torch.float64)],
]


@pytest.mark.parametrize("value", SUPPORTED, ids=[f"{type(v).__name__}-{i}" for i, v in enumerate(SUPPORTED)])
def test_every_supported_value_round_trips_with_its_exact_type(value: Any) -> None:
    decoded = row_values.decode(row_values.encode({"f": {3: value}}), "here")
    assert list(decoded) == ["f"] and list(decoded["f"]) == [3]
    assert _same(decoded["f"][3], value), (decoded["f"][3], value)


def test_fields_and_rows_keep_their_order() -> None:
    rows: dict[str, dict[int, Any]] = {"b": {9: "x", 2: "y"}, "a": {5: None}}
    decoded = row_values.decode(row_values.encode(rows), "here")
    assert list(decoded) == ["b", "a"] and list(decoded["b"]) == [9, 2]


def test_the_encoding_is_plain_json_without_nan() -> None:
    encoded = row_values.encode({"f": {0: [math.nan, b"\x01", (1,)]}}).decode()
    assert "NaN" not in encoded
    assert encoded == '{"f":[[0,[{"$float":"nan"},{"$bytes":"AQ=="},{"$tuple":[1]}]]]}'


class _Float(float):
    pass


@pytest.mark.parametrize(
    ("value", "type_name"),
    [
        (np.float64(1.5), "numpy.float64"),
        (np.int64(3), "numpy.int64"),
        (np.zeros(2), "numpy.ndarray"),
        (_Float(1.0), "_Float"),
        ({1, 2}, "builtins.set"),
        (frozenset(), "builtins.frozenset"),
        (bytearray(b"x"), "builtins.bytearray"),
        (object(), "builtins.object"),
        (torch.nn.Parameter(torch.ones(1)), "torch.nn.parameter.Parameter"),
        (torch.ones(2, device="meta"), "torch.Tensor"),
        (torch.ones(2).to_sparse(), "torch.Tensor"),
        ([1, {"k": (np.float32(1),)}], "numpy.float32"),  # found inside containers too
    ],
)
def test_a_value_it_cannot_hold_exactly_is_refused_naming_the_field_row_and_type(value: Any, type_name: str) -> None:
    with pytest.raises(UnstorableValue, match=rf"^field 'f', row 4: a value of type \S*{type_name}, "):
        row_values.encode({"f": {4: value}})


def test_a_tensor_that_requires_grad_is_refused() -> None:
    with pytest.raises(UnstorableValue, match="field 'f', row 0: a tensor that requires grad"):
        row_values.encode({"f": {0: torch.ones(2, requires_grad=True)}})


@pytest.mark.parametrize(
    "section",
    [
        b"not json",
        b"[1, 2]",
        b'{"f": [["0", 1]]}',  # a row index that is not an int
        b'{"f": [[0, {"$exec": "print(1)"}]]}',  # an unknown tag
        b'{"f": [[0, {"$tuple": [], "$bytes": ""}]]}',  # two tags in one object
        b'{"f": [[0, {"$bytes": "not base64!"}]]}',
        b'{"f": [[0, {"$tensor": ["no_such_dtype", [1], ""]}]]}',
        b'{"f": [[0, {"$tensor": ["int64", [2], "AAAA"]}]]}',  # 3 bytes for two int64
        b'{"f": [[0, {"$dict": [[[1], 2]]}]]}',  # an unhashable key
        b'{"f": [[0, {"$float": "1e5"}]]}',
        pickle.dumps({"f": {0: 1}}),
    ],
)
def test_a_malformed_section_is_refused_naming_where(section: bytes) -> None:
    with pytest.raises(CheckpointCorrupt, match=r"^/some/su_0: unreadable rows section"):
        row_values.decode(section, "/some/su_0")
