"""Per-run wake-up signals: watch events set them, each run's supervisor waits on its own. asyncio only.

Several events between two reconciles coalesce into one wake-up; a run is never reconciled by two coroutines
at once, because only its own supervisor (`handlers.supervise`) reconciles it.

A TrainingRun's own watch events mostly carry the operator's writes (its status patches, kopf's finalizer):
waking on them costs a pass per write that learns nothing new. What a pass reads from the TrainingRun and did
not write itself is its generation (spec edits), `status.runtime` (the driver's reports, less the progress
fields it sends about once a second) and the deletion mark; `saw` keeps those as the last pass read them and
`is_news` tells whether a watch event changes them. The progress fields are news once the driver's report is
`PROGRESS_REFRESH_SECONDS` newer (by its own `updated`) than the one the last pass read: the PROGRESS and ETA
columns (`progress.py`) follow the driver at that pace, one pass per run and period, not one per report.
Every call here happens on the event loop (the kopf handlers that call it are coroutines): asyncio.Event is
not thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Mapping
from typing import Any

from trainingrun_runtime import contract, timestamps

__all__ = ["PROGRESS_REFRESH_SECONDS", "Wakeups", "wait_any"]

PROGRESS_REFRESH_SECONDS = 30.0
"""A progress report alone wakes a run once it is this much newer than the report the last pass read."""


class Wakeups:
    """asyncio.Events keyed by (namespace, name)."""

    def __init__(self) -> None:
        self._events: dict[tuple[str, str], asyncio.Event] = {}
        self._seen: dict[tuple[str, str], tuple[tuple[object, ...], str | None]] = {}

    def event(self, namespace: str, name: str) -> asyncio.Event:
        return self._events.setdefault((namespace, name), asyncio.Event())

    def wake(self, namespace: str, name: str) -> None:
        self.event(namespace, name).set()

    def wake_all(self) -> None:
        for event in self._events.values():
            event.set()

    def saw(self, namespace: str, name: str, run: Mapping[str, Any]) -> None:
        """A pass read TrainingRun `run` (a raw object)."""
        self._seen[(namespace, name)] = (_news(run), _reported(run))

    def is_news(self, namespace: str, name: str, run: Mapping[str, Any]) -> bool:
        """Does `run` (from a watch event) differ from the last pass's read in what the operator did not write,
        or carry a progress report PROGRESS_REFRESH_SECONDS newer than that read's?"""
        seen = self._seen.get((namespace, name))
        if seen is None or seen[0] != _news(run):
            return True
        return _newer(seen[1], _reported(run)) >= PROGRESS_REFRESH_SECONDS

    def forget(self, namespace: str, name: str) -> None:
        self._events.pop((namespace, name), None)
        self._seen.pop((namespace, name), None)

    def __len__(self) -> int:
        return len(self._events)


PROGRESS_ONLY = contract.PROGRESS_FIELDS
"""`status.runtime` fields a decision needs only when an attempt ends (`stepsLost`), from the pass that ends it,
while the head's node is NotReady (`updated`), from the pass its grace asked for, for the stall watchdog (`step`,
`updated`), from the pass its deadline asked for, and for what kubectl shows (`progress.py`), which may lag: the
driver reports them about once a second, and they alone wake a run at most once per PROGRESS_REFRESH_SECONDS of
reports."""


def _news(run: Mapping[str, Any]) -> tuple[object, ...]:
    meta, status = run.get("metadata") or {}, run.get("status") or {}
    runtime = status.get(contract.REPORT_FIELD)
    if isinstance(runtime, Mapping):
        runtime = {k: v for k, v in runtime.items() if k not in PROGRESS_ONLY}
    return meta.get("generation"), meta.get("deletionTimestamp"), json.dumps(runtime, sort_keys=True)


def _reported(run: Mapping[str, Any]) -> str | None:
    """When the driver's report in `run` was written (status.runtime.updated), if it says."""
    runtime: contract.RuntimeStatus | None = (run.get("status") or {}).get(contract.REPORT_FIELD)
    updated = runtime.get("updated") if isinstance(runtime, Mapping) else None
    return updated if isinstance(updated, str) else None


def _newer(before: str | None, after: str | None) -> float:
    """Seconds from report time `before` to `after`; 0 if either is missing or unreadable."""
    if before is None or after is None:
        return 0.0
    try:
        return (timestamps.parse(after) - timestamps.parse(before)).total_seconds()
    except ValueError:
        return 0.0


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
