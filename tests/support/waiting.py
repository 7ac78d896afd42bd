"""The one way a test waits: poll a probe until it returns something truthy, or fail naming what it waited for.

    from support import waiting
    pod = waiting.wait(lambda: runner.find(ns, "head"), timeout=60, what="the head played",
                       diagnostics=runner.describe)

A wait is for an event or a condition, never for time to pass: a test that asserts that nothing happened first
waits for proof that the work which could have done it ran (for the pod runner: `completed_passes`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def wait(
    probe: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    diagnostics: Callable[[], str] | None = None,
    interval: float = 0.2,
) -> T:
    """Calls `probe` every `interval` seconds until it returns a truthy value, and returns that value. After
    `timeout` seconds the test fails with "timed out ... waiting for <what>", the probe's last value and, when
    given, what `diagnostics()` says (logs, a component's state). An exception from the probe is not caught."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            message = f"timed out after {timeout:.0f}s waiting for {what}; last value: {value!r}"
            pytest.fail(f"{message}\n{diagnostics()}" if diagnostics is not None else message)
        time.sleep(interval)
