"""Per-run wake-up signals: watch events set them, each run's supervisor waits on its own. asyncio only.

Several events between two reconciles coalesce into one wake-up; a run is never reconciled by two coroutines
at once, because only its own supervisor (`handlers.supervise`) reconciles it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable

__all__ = ["Wakeups", "wait_any"]


class Wakeups:
    """asyncio.Events keyed by (namespace, name)."""

    def __init__(self) -> None:
        self._events: dict[tuple[str, str], asyncio.Event] = {}

    def event(self, namespace: str, name: str) -> asyncio.Event:
        return self._events.setdefault((namespace, name), asyncio.Event())

    def wake(self, namespace: str, name: str) -> None:
        self.event(namespace, name).set()

    def wake_all(self) -> None:
        for event in self._events.values():
            event.set()

    def forget(self, namespace: str, name: str) -> None:
        self._events.pop((namespace, name), None)

    def __len__(self) -> int:
        return len(self._events)


async def wait_any(*waits: Awaitable[object], timeout: float | None) -> None:
    """Return when the first of `waits` finishes or after `timeout` seconds; cancel the rest."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
