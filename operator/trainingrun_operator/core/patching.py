"""JSON merge patches (RFC 7386) computed from an old and a new object. Pure.

`decision.py` returns the operator's new status; this turns it into the smallest merge patch, so that a field
the new status drops is sent as null (deleted) and the driver's `status.runtime` is never touched.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["apply", "diff"]


def diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that turns `old` into `new` (lists are replaced whole, as merge patch does)."""
    patch: dict[str, Any] = {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = diff(before, value)
            if sub:
                patch[key] = sub
        elif key not in old or before != value:
            patch[key] = value
    return patch


def apply(target: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """Apply a merge patch to `target` and return the result (the input is not modified)."""
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping):
            base = out.get(key)
            out[key] = apply(base if isinstance(base, Mapping) else {}, value)
        else:
            out[key] = value
    return out
