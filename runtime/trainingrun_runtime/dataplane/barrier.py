"""DataPlaneCheckpointBarrier: many data-plane mutations at once, or one checkpoint alone.

Called by the replay buffer (`reserve` / `commit` / `remove_group` each run inside
`barrier.mutation()`) and by the controller's save path (capture the index, check
the stored rows, snapshot TransferQueue — all inside one `barrier.checkpoint()`).
Both sides share one instance, created in the controller actor. Pure asyncio:
no Ray, no torch, testable in milliseconds with an injected clock.

Rules:
- Any number of mutations may run concurrently.
- A checkpoint that has *started waiting* closes the gate: new mutations block
  until no checkpoint is pending, so a stream of writers cannot starve it. It then
  waits for the mutations already inside to drain, and only then is exclusive.
- Checkpoints are serialized (FIFO); while any checkpoint is pending or running
  the gate stays closed.
- Cancelling a checkpoint (waiting or inside) releases everything it held; when
  it was the last pending one the gate reopens and blocked mutations proceed.
- `asyncio.CancelledError` is never swallowed. An exception raised inside a window
  propagates after the window is released.
- Calling `mutation()` from the task that holds `checkpoint()` (or the reverse)
  would deadlock; it raises `RuntimeError` instead.

Concurrency note: the loop is single-threaded, so every check of state and the
update that follows it happen with no `await` in between; release paths never
await, so they cannot be interrupted by a second cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable

__all__ = ["BarrierStats", "DataPlaneCheckpointBarrier"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BarrierStats:
    """A snapshot of the barrier's counters; durations are in seconds of the injected clock."""

    checkpoints: int = 0
    """Checkpoint windows completed (entered and left, normally or by exception)."""
    last_exclusive_s: float | None = None
    """Duration of the last exclusive window: from mutations drained to checkpoint exit."""
    last_hold_s: float | None = None
    """Duration the last checkpoint kept the gate closed: from its request to its exit (drain included)."""
    max_exclusive_s: float = 0.0
    """Longest exclusive window seen."""
    total_exclusive_s: float = 0.0
    """Sum of all exclusive windows."""
    active_mutations: int = 0
    """Mutations inside their window right now."""
    pending_checkpoints: int = 0
    """Checkpoints waiting or running right now."""


class DataPlaneCheckpointBarrier:
    """Many concurrent mutations, one checkpoint at a time; a waiting checkpoint blocks new mutations."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._active = 0
        self._pending = 0
        self._gate_open = asyncio.Event()
        self._gate_open.set()
        self._drained = asyncio.Event()
        self._drained.set()
        self._checkpoint_lock = asyncio.Lock()
        self._holder: asyncio.Task[object] | None = None
        self._mutating: dict[asyncio.Task[object], int] = {}
        self._stats = BarrierStats()

    @property
    def stats(self) -> BarrierStats:
        """Counters and the last exclusive-window duration, as a frozen snapshot."""
        return dataclasses.replace(self._stats, active_mutations=self._active, pending_checkpoints=self._pending)

    @contextlib.asynccontextmanager
    async def mutation(self) -> AsyncIterator[None]:
        """Hold a shared slot: waits while any checkpoint is pending, then runs alongside other mutations."""
        task = asyncio.current_task()
        if task is not None and task is self._holder:
            raise RuntimeError("mutation() inside checkpoint() of the same task would deadlock")
        while self._pending:
            await self._gate_open.wait()
        # No await between the check above and the increment below.
        self._active += 1
        self._drained.clear()
        if task is not None:
            self._mutating[task] = self._mutating.get(task, 0) + 1
        try:
            yield
        finally:
            self._active -= 1
            if task is not None:
                left = self._mutating[task] - 1
                if left:
                    self._mutating[task] = left
                else:
                    del self._mutating[task]
            if self._active == 0:
                self._drained.set()

    @contextlib.asynccontextmanager
    async def checkpoint(self) -> AsyncIterator[None]:
        """Hold the exclusive slot: close the gate, wait for earlier checkpoints and active mutations, run alone."""
        task = asyncio.current_task()
        if task is not None and task in self._mutating:
            raise RuntimeError("checkpoint() inside mutation() of the same task would deadlock")
        requested = self._clock()
        self._pending += 1
        self._gate_open.clear()
        try:
            async with self._checkpoint_lock:
                while self._active:
                    await self._drained.wait()
                # Exclusive from here: no mutation is inside and none can enter.
                self._holder = task
                entered = self._clock()
                try:
                    yield
                finally:
                    self._holder = None
                    self._record(requested, entered, self._clock())
        finally:
            self._pending -= 1
            if self._pending == 0:
                self._gate_open.set()

    def _record(self, requested: float, entered: float, left: float) -> None:
        exclusive = left - entered
        s = self._stats
        self._stats = dataclasses.replace(
            s,
            checkpoints=s.checkpoints + 1,
            last_exclusive_s=exclusive,
            last_hold_s=left - requested,
            max_exclusive_s=max(s.max_exclusive_s, exclusive),
            total_exclusive_s=s.total_exclusive_s + exclusive,
        )
        log.debug("checkpoint window closed: exclusive %.6fs, hold %.6fs", exclusive, left - requested)
