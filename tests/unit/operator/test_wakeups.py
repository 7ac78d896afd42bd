"""Wake-up signals: events coalesce, and a supervisor waits for the first of wake, stop or timeout."""

from __future__ import annotations

import asyncio
import time

from trainingrun_operator.kube import wakeups


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


def progress_report(step: int, updated: str) -> dict[str, object]:
    runtime = {"attempt": 1, "step": step, "reward": 0.5, "updated": updated}
    return {"metadata": {"generation": 1}, "status": {"phase": "Running", "runtime": runtime}}


def test_progress_reports_wake_a_run_only_once_they_are_the_refresh_period_newer_than_the_last_pass_read() -> None:
    signals = wakeups.Wakeups()
    signals.saw("ns", "a", progress_report(10, "2025-01-01T00:00:00.000Z"))
    assert not signals.is_news("ns", "a", progress_report(11, "2025-01-01T00:00:01.000Z"))
    assert not signals.is_news("ns", "a", progress_report(39, "2025-01-01T00:00:29.999Z"))
    assert signals.is_news("ns", "a", progress_report(40, "2025-01-01T00:00:30.000Z"))
    signals.saw("ns", "a", progress_report(40, "2025-01-01T00:00:30.000Z"))
    assert not signals.is_news("ns", "a", progress_report(41, "2025-01-01T00:00:31.000Z"))


def test_a_progress_report_with_an_unreadable_time_wakes_no_one() -> None:
    signals = wakeups.Wakeups()
    signals.saw("ns", "a", progress_report(10, "2025-01-01T00:00:00.000Z"))
    assert not signals.is_news("ns", "a", progress_report(99, "yesterday"))
