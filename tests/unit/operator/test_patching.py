"""Merge patches: the diff of two objects, applied to the first, gives the second."""

from __future__ import annotations

from typing import Any

import pytest

from trainingrun_operator.core import patching

CASES: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = [
    ({}, {"a": 1}, {"a": 1}),
    ({"a": 1}, {}, {"a": None}),
    ({"a": {"x": 1, "y": 2}}, {"a": {"x": 1}}, {"a": {"y": None}}),
    ({"a": [1, 2]}, {"a": [1]}, {"a": [1]}),
    ({"a": {"x": 1}}, {"a": {"x": 1}}, {}),
    ({"a": 1}, {"a": {"x": 1}}, {"a": {"x": 1}}),
]


@pytest.mark.parametrize(("old", "new", "expected"), CASES)
def test_diff_is_the_smallest_merge_patch_and_applies_back(
    old: dict[str, Any], new: dict[str, Any], expected: dict[str, Any]
) -> None:
    patch = patching.diff(old, new)
    assert patch == expected
    assert patching.apply(old, patch) == new
