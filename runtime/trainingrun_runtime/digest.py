"""Canonical JSON and SHA-256 digests of plain values.

Called by the replay buffer (the digest over its groups that ties
`replay_buffer_metadata.pt` to `data_plane/`), by the checkpoint bundle
(`config_hash`) and by anyone who needs two equal values to hash equally across
processes and runs. Standard library only.

Canonical form: `json.dumps` with sorted keys, compact separators (`,` `:`),
`ensure_ascii=True`, UTF-8 (so pure ASCII) bytes. Dict key order never changes
the digest.

Accepted values: `None`, `bool`, `int`, finite `float`, `str`, `dict` with `str`
keys, `list` and `tuple` (a tuple is an array: `(1, 2)` and `[1, 2]` digest the
same, as they would after any JSON round trip).
Rejected with `DigestError` naming the field path (`groups[3].ids[1]`):
NaN and +/-Inf; non-`str` dict keys (JSON would silently turn `1` into `"1"`
and could merge two keys); `set`/`frozenset` (no defined order: sort them into a
list first); `bytes`/`bytearray` (no JSON form: encode them explicitly); any
other object (tensors, numpy scalars, dataclasses: convert them first); and
reference cycles.
"""

from __future__ import annotations

import hashlib
import json
import math
import re

from trainingrun_runtime.errors import DigestError

__all__ = ["canonical_json", "check_digest", "sha256_hex"]

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def canonical_json(obj: object) -> bytes:
    """Return the canonical JSON encoding of `obj` as ASCII bytes; raise DigestError naming the bad field."""
    _validate(obj, "", set())
    text = json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False, check_circular=False
    )
    return text.encode("ascii")


def sha256_hex(obj: object) -> str:
    """Return the hex SHA-256 of `canonical_json(obj)`."""
    return hashlib.sha256(canonical_json(obj)).hexdigest()


def check_digest(obj: object, expected: str, *, what: str = "value") -> None:
    """Raise DigestError if `sha256_hex(obj)` differs from `expected` (`what` names the value in the message)."""
    actual = sha256_hex(obj)
    if actual != expected:
        raise DigestError(f"{what}: digest mismatch: expected {expected}, computed {actual}")


def _child(path: str, key: str) -> str:
    if _IDENT.match(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key)}]"


def _where(path: str) -> str:
    return path or "$ (the root value)"


def _validate(obj: object, path: str, stack: set[int]) -> None:
    # Scalars first: the common case.
    if obj is None or isinstance(obj, (bool, str)):
        return
    if isinstance(obj, int):
        return
    if isinstance(obj, float):
        if not math.isfinite(obj):
            raise DigestError(f"{_where(path)}: {obj!r} is not allowed (only finite numbers have a JSON form)")
        return
    if isinstance(obj, (dict, list, tuple)):
        ident = id(obj)
        if ident in stack:
            raise DigestError(f"{_where(path)}: circular reference")
        stack.add(ident)
        try:
            if isinstance(obj, dict):
                for key, value in obj.items():
                    if not isinstance(key, str):
                        raise DigestError(
                            f"{_where(path)}: dict key {key!r} has type {type(key).__name__}, only str keys are allowed"
                        )
                    _validate(value, _child(path, key), stack)
            else:
                for index, item in enumerate(obj):
                    _validate(item, f"{path}[{index}]", stack)
        finally:
            stack.discard(ident)
        return
    if isinstance(obj, (set, frozenset)):
        hint = "has no defined order; sort it into a list"
    elif isinstance(obj, (bytes, bytearray, memoryview)):
        hint = "has no JSON form; encode it (hex/base64) explicitly"
    else:
        hint = "is not a JSON value; convert it to None/bool/int/float/str/list/dict"
    raise DigestError(f"{_where(path)}: {type(obj).__module__}.{type(obj).__qualname__} {hint}")
