"""Wake-up signals: events coalesce, and a supervisor waits for the first of wake, stop or timeout."""

from __future__ import annotations

import asyncio
import time

from trainingrun_operator import wakeups


async def test_several_wakes_before_a_wait_coalesce_into_one() -> None:
    signals = wakeups.Wakeups()
    event = signals.event("ns", "a")
    signals.wake("ns", "a")
    signals.wake("ns", "a")
    assert event.is_set()
    event.clear()
    started = time.monotonic()
    await wakeups.wait_any(event.wait(), timeout=0.05)
    assert time.monotonic() - started >= 0.04


async def test_wake_all_reaches_every_run_and_forget_drops_one() -> None:
    signals = wakeups.Wakeups()
    a, b = signals.event("ns", "a"), signals.event("other", "b")
    signals.wake_all()
    assert a.is_set() and b.is_set()
    signals.forget("ns", "a")
    assert len(signals) == 1


async def test_wait_any_returns_on_the_first_signal_and_cancels_the_rest() -> None:
    first, never = asyncio.Event(), asyncio.Event()
    asyncio.get_running_loop().call_later(0.01, first.set)
    started = time.monotonic()
    await wakeups.wait_any(first.wait(), never.wait(), timeout=5)
    assert time.monotonic() - started < 1
    assert len(asyncio.all_tasks()) == 1, "no waiter left behind"
