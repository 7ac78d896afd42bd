"""Canonical JSON and digests: key order never matters, bad values are refused by field path."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from trainingrun_runtime.digest import canonical_json, check_digest, sha256_hex
from trainingrun_runtime.errors import DigestError


def test_canonical_json_sorts_keys_and_has_no_whitespace() -> None:
    assert canonical_json({"b": 1, "a": [1, 2.5, None, True], "c": {"z": "x", "y": {}}}) == (
        b'{"a":[1,2.5,null,true],"b":1,"c":{"y":{},"z":"x"}}'
    )


def test_key_order_does_not_change_the_digest() -> None:
    a = {"groups": [{"ids": [1, 2], "prompt": 7}], "partition": "train", "mode": "authoritative"}
    b = {"mode": "authoritative", "partition": "train", "groups": [{"prompt": 7, "ids": [1, 2]}]}
    assert sha256_hex(a) == sha256_hex(b)


def test_list_order_does_change_the_digest() -> None:
    assert sha256_hex({"ids": [1, 2]}) != sha256_hex({"ids": [2, 1]})


def test_the_digest_is_sha256_of_the_canonical_bytes() -> None:
    value = {"x": 1}
    assert sha256_hex(value) == hashlib.sha256(b'{"x":1}').hexdigest()


def test_non_ascii_text_is_escaped_so_the_bytes_are_ascii() -> None:
    out = canonical_json({"name": "héllo ☃"})
    assert out == b'{"name":"h\\u00e9llo \\u2603"}'
    assert json.loads(out) == {"name": "héllo ☃"}


def test_a_tuple_digests_like_the_list_it_becomes_in_json() -> None:
    assert canonical_json({"ids": (1, 2)}) == canonical_json({"ids": [1, 2]})


@pytest.mark.parametrize(
    ("value", "path", "problem"),
    [
        ({"groups": [{"ids": [0]}] * 3 + [{"ids": [1, float("nan")]}]}, "groups[3].ids[1]", "nan"),
        ({"reward": float("inf")}, "reward", "inf"),
        ({"a": {"b": -float("inf")}}, "a.b", "-inf"),
        ({"tags": {1, 2}}, "tags", "no defined order"),
        ({"tags": frozenset()}, "tags", "no defined order"),
        ({"blob": b"\x00"}, "blob", "no JSON form"),
        ({"blob": bytearray(b"x")}, "blob", "no JSON form"),
        ({"x": [object()]}, "x[0]", "not a JSON value"),
        ({"group key": [1, 1.5, complex(1, 2)]}, '["group key"][2]', "not a JSON value"),
        ({"m": {1: "a"}}, "m", "dict key 1 has type int"),
        (float("nan"), "$", "nan"),
    ],
)
def test_bad_values_are_refused_naming_the_field_path(value: Any, path: str, problem: str) -> None:
    with pytest.raises(DigestError) as info:
        canonical_json(value)
    message = str(info.value)
    assert message.startswith(f"{path}")
    assert problem in message
    with pytest.raises(DigestError):
        sha256_hex(value)


def test_a_reference_cycle_is_refused() -> None:
    a: list[Any] = [1]
    a.append({"back": a})
    with pytest.raises(DigestError, match=r"^\[1\]\.back: circular reference"):
        canonical_json(a)


def test_a_shared_but_acyclic_value_is_accepted() -> None:
    shared = [1, 2]
    assert canonical_json({"a": shared, "b": shared}) == b'{"a":[1,2],"b":[1,2]}'


def test_check_digest_passes_on_match_and_names_the_value_on_mismatch() -> None:
    value = {"groups": [[0, 1], [2, 3]]}
    check_digest(value, sha256_hex(value), what="replay_buffer_metadata.pt")
    with pytest.raises(DigestError, match=r"^replay_buffer_metadata\.pt: digest mismatch: expected 00"):
        check_digest(value, "00" * 32, what="replay_buffer_metadata.pt")
