"""The rows of a storage unit that are not dense CPU tensors, as JSON: a format that cannot run code when read.

`column_file` (format 3) writes these rows (strings, the per-row tensors of a ragged field, None, tags) with
`encode` and reads them with `decode`; format 2 pickled them. Every value keeps its exact type and value:

    None, bool, int, str      themselves (JSON; ints of any size)
    float                     itself if finite, else {"$float": "nan" | "inf" | "-inf"}
    list                      a JSON array of encoded items
    tuple, bytes              {"$tuple": [...]}, {"$bytes": base64}
    dict                      {"$dict": [[key, value], ...]} (any encodable key, insertion order kept)
    torch.Tensor (dense CPU)  {"$tensor": [dtype, shape, base64 of its bytes]}

A JSON object is always one of these tags, so nothing is ambiguous. Any other type (a numpy scalar, a float
subclass, a nested or GPU tensor, an object) fails the save with `UnstorableValue` naming the field, the row and
the type: a value is never changed to fit. `decode` builds only these types; a malformed section is a
`CheckpointCorrupt`.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping
from typing import Any, Final

import torch

from trainingrun_runtime.errors import CheckpointCorrupt, UnstorableValue

__all__ = ["decode", "encode"]

_NON_FINITE: Final = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_DTYPES: Final = {str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)}


def encode(rows: Mapping[str, Mapping[int, Any]]) -> bytes:
    """{field: {global index: value}} as UTF-8 JSON; UnstorableValue naming the field, row and type it cannot hold."""
    section = {}
    for name, values in rows.items():
        encoded = []
        for gi, value in values.items():
            try:
                encoded.append([gi, _encode(value)])
            except UnstorableValue as e:
                raise UnstorableValue(f"field {name!r}, row {gi}: {e}") from None
        section[name] = encoded
    return json.dumps(section, separators=(",", ":"), allow_nan=False).encode()


def decode(data: bytes | memoryview, where: str) -> dict[str, dict[int, Any]]:
    """The rows `encode` wrote; CheckpointCorrupt naming `where` if the section is not that encoding."""
    try:
        section = json.loads(bytes(data))
        if not isinstance(section, dict):
            raise ValueError("not an object of fields")
        found: dict[str, dict[int, Any]] = {}
        for name, values in section.items():
            rows: dict[int, Any] = {}
            for gi, value in values:
                if type(gi) is not int:
                    raise ValueError(f"field {name!r}: row index {gi!r}")
                rows[gi] = _decode(value)
            found[name] = rows
        return found
    except (ValueError, TypeError, KeyError, RuntimeError) as e:
        raise CheckpointCorrupt(f"{where}: unreadable rows section ({type(e).__name__}: {e})") from None


def _encode(value: Any) -> Any:
    kind = type(value)  # exact types: a subclass (numpy.float64 is a float) would come back as its base
    if value is None or kind in (bool, int, str):
        return value
    if kind is float:
        return value if math.isfinite(value) else {"$float": repr(value)}
    if kind is list:
        return [_encode(v) for v in value]
    if kind is tuple:
        return {"$tuple": [_encode(v) for v in value]}
    if kind is bytes:
        return {"$bytes": base64.b64encode(value).decode("ascii")}
    if kind is dict:
        return {"$dict": [[_encode(k), _encode(v)] for k, v in value.items()]}
    if (
        kind is torch.Tensor
        and value.layout == torch.strided
        and value.is_cpu
        and not (value.is_quantized or value.is_nested)
    ):
        if value.requires_grad:
            raise UnstorableValue("a tensor that requires grad (its autograd state cannot be stored)")
        data = value.contiguous().view(-1).view(torch.uint8).numpy().tobytes() if value.numel() else b""
        name = str(value.dtype).removeprefix("torch.")
        return {"$tensor": [name, list(value.shape), base64.b64encode(data).decode("ascii")]}
    raise UnstorableValue(f"a value of type {kind.__module__}.{kind.__qualname__}, which the format cannot hold")


def _decode(value: Any) -> Any:
    if value is None or type(value) in (bool, int, float, str):
        return value
    if type(value) is list:
        return [_decode(v) for v in value]
    if type(value) is not dict or len(value) != 1:
        raise ValueError(f"not an encoded value: {value!r:.80}")
    ((tag, body),) = value.items()
    if tag == "$float":
        return _NON_FINITE[body]
    if tag == "$tuple":
        return tuple(_decode(v) for v in body)
    if tag == "$bytes":
        return base64.b64decode(body, validate=True)
    if tag == "$dict":
        return {_decode(k): _decode(v) for k, v in body}
    if tag == "$tensor":
        name, shape, data = body
        dtype = _DTYPES[name]
        raw = bytearray(base64.b64decode(data, validate=True))
        if not raw:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(raw, dtype=dtype).view(shape)
    raise ValueError(f"unknown tag {tag!r}")
