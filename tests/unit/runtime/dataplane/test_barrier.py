"""DataPlaneCheckpointBarrier: ordering, starvation, cancellation, sequencing, exceptions, stats.

Deterministic: tasks are coordinated with Events and `settle()` (yield to the loop a
few times); no sleeps, every test finishes in milliseconds.
"""

from __future__ import annotations

import asyncio

import pytest

from support.loop import settle
from trainingrun_runtime.dataplane.barrier import DataPlaneCheckpointBarrier

pytestmark = pytest.mark.timeout(10)


class Mutator:
    """A task that enters a mutation, records it, and holds it until released."""

    def __init__(self, barrier: DataPlaneCheckpointBarrier, log: list[str], name: str) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.task = asyncio.create_task(self._run(barrier, log, name))

    async def _run(self, barrier: DataPlaneCheckpointBarrier, log: list[str], name: str) -> None:
        async with barrier.mutation():
            log.append(f"{name}+")
            self.entered.set()
            await self.release.wait()
            log.append(f"{name}-")


class Checkpointer:
    """A task that enters a checkpoint, records it, and holds it until released."""

    def __init__(self, barrier: DataPlaneCheckpointBarrier, log: list[str], name: str) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.task = asyncio.create_task(self._run(barrier, log, name))

    async def _run(self, barrier: DataPlaneCheckpointBarrier, log: list[str], name: str) -> None:
        async with barrier.checkpoint():
            log.append(f"{name}+")
            self.entered.set()
            await self.release.wait()
            log.append(f"{name}-")


async def test_many_mutations_run_at_the_same_time() -> None:
    barrier = DataPlaneCheckpointBarrier()
    log: list[str] = []
    ms = [Mutator(barrier, log, f"m{i}") for i in range(5)]
    await settle()
    assert all(m.entered.is_set() for m in ms)
    assert barrier.stats.active_mutations == 5
    for m in ms:
        m.release.set()
    await asyncio.gather(*(m.task for m in ms))
    assert barrier.stats.active_mutations == 0


async def test_a_checkpoint_waits_for_active_mutations_to_drain() -> None:
    barrier = DataPlaneCheckpointBarrier()
    log: list[str] = []
    m1, m2 = Mutator(barrier, log, "m1"), Mutator(barrier, log, "m2")
    await settle()
    c = Checkpointer(barrier, log, "c")
    await settle()
    assert not c.entered.is_set()
    m1.release.set()
    await settle()
    assert not c.entered.is_set()
    m2.release.set()
    await settle()
    assert c.entered.is_set()
    c.release.set()
    await asyncio.gather(m1.task, m2.task, c.task)
    assert log == ["m1+", "m2+", "m1-", "m2-", "c+", "c-"]


async def test_a_waiting_checkpoint_blocks_new_mutations_so_writers_cannot_starve_it() -> None:
    barrier = DataPlaneCheckpointBarrier()
    log: list[str] = []
    m1 = Mutator(barrier, log, "m1")
    await settle()
    c = Checkpointer(barrier, log, "c")
    await settle()
    late = Mutator(barrier, log, "late")  # arrives after the checkpoint started waiting
    await settle()
    assert not late.entered.is_set()
    m1.release.set()
    await settle()
    assert c.entered.is_set()
    assert not late.entered.is_set()
    c.release.set()
    await settle()
    assert late.entered.is_set()
    late.release.set()
    await asyncio.gather(m1.task, c.task, late.task)
    assert log == ["m1+", "m1-", "c+", "c-", "late+", "late-"]


async def test_a_stream_of_overlapping_writers_still_lets_the_checkpoint_in() -> None:
    barrier = DataPlaneCheckpointBarrier()
    log: list[str] = []
    current = Mutator(barrier, log, "w0")
    await settle()
    c = Checkpointer(barrier, log, "c")
    # Each writer hands over to the next one before leaving; without the gate the
    # active count would never reach zero.
    writers = [current]
    for i in range(1, 20):
        nxt = Mutator(barrier, log, f"w{i}")
        writers.append(nxt)
        current.release.set()
        await settle()
        current = nxt
    assert c.entered.is_set()
    assert not any(w.entered.is_set() for w in writers[1:])
    c.release.set()
    await settle()
    assert all(w.entered.is_set() for w in writers[1:])
    for w in writers:
        w.release.set()
    await asyncio.gather(c.task, *(w.task for w in writers))


async def test_two_checkpoints_run_one_after_the_other() -> None:
    barrier = DataPlaneCheckpointBarrier()
    log: list[str] = []
    c1 = Checkpointer(barrier, log, "c1")
    await settle()
    c2 = Checkpointer(barrier, log, "c2")
    m = Mutator(barrier, log, "m")
    await settle()
    assert c1.entered.is_set() and not c2.entered.is_set() and not m.entered.is_set()
    c1.release.set()
    await settle()
    assert c2.entered.is_set() and not m.entered.is_set()
    c2.release.set()
    await settle()
    assert m.entered.is_set()
    m.release.set()
    await asyncio.gather(c1.task, c2.task, m.task)
    assert log == ["c1+", "c1-", "c2+", "c2-", "m+", "m-"]
    assert barrier.stats.checkpoints == 2


async def test_cancelling_a_waiting_checkpoint_releases_blocked_mutations() -> None:
    barrier = DataPlaneCheckpointBarrier()
    log: list[str] = []
    m1 = Mutator(barrier, log, "m1")
    await settle()
    c = Checkpointer(barrier, log, "c")
    await settle()
    blocked = Mutator(barrier, log, "blocked")
    await settle()
    assert not blocked.entered.is_set()
    c.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await c.task
    await settle()
    assert blocked.entered.is_set()
    assert not c.entered.is_set()
    stats = barrier.stats
    assert stats.pending_checkpoints == 0 and stats.checkpoints == 0
    m1.release.set()
    blocked.release.set()
    await asyncio.gather(m1.task, blocked.task)
    # The barrier is still usable afterwards.
    async with barrier.checkpoint():
        pass
    assert barrier.stats.checkpoints == 1


async def test_cancelling_a_checkpoint_queued_behind_another_keeps_the_first_exclusive() -> None:
    barrier = DataPlaneCheckpointBarrier()
    log: list[str] = []
    c1 = Checkpointer(barrier, log, "c1")
    await settle()
    c2 = Checkpointer(barrier, log, "c2")
    m = Mutator(barrier, log, "m")
    await settle()
    c2.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await c2.task
    await settle()
    assert not m.entered.is_set()  # c1 still holds the gate
    c1.release.set()
    await settle()
    assert m.entered.is_set()
    m.release.set()
    await asyncio.gather(c1.task, m.task)
    assert log == ["c1+", "c1-", "m+", "m-"]


async def test_cancelling_inside_the_window_reraises_and_releases() -> None:
    barrier = DataPlaneCheckpointBarrier()
    log: list[str] = []
    c = Checkpointer(barrier, log, "c")
    await settle()
    m = Mutator(barrier, log, "m")
    await settle()
    c.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await c.task
    await settle()
    assert m.entered.is_set()
    m.release.set()
    await m.task
    assert barrier.stats.checkpoints == 1


async def test_cancelling_a_blocked_mutation_leaves_no_trace() -> None:
    barrier = DataPlaneCheckpointBarrier()
    log: list[str] = []
    c = Checkpointer(barrier, log, "c")
    await settle()
    m = Mutator(barrier, log, "m")
    await settle()
    m.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await m.task
    assert barrier.stats.active_mutations == 0
    c.release.set()
    await c.task
    c2 = Checkpointer(barrier, log, "c2")
    await settle()
    assert c2.entered.is_set()
    c2.release.set()
    await c2.task


async def test_an_exception_inside_a_mutation_releases_its_slot() -> None:
    barrier = DataPlaneCheckpointBarrier()
    with pytest.raises(ValueError, match="put failed"):
        async with barrier.mutation():
            raise ValueError("put failed")
    assert barrier.stats.active_mutations == 0
    async with barrier.checkpoint():
        pass


async def test_an_exception_inside_a_checkpoint_releases_the_gate() -> None:
    barrier = DataPlaneCheckpointBarrier()
    log: list[str] = []

    async def failing_checkpoint() -> None:
        async with barrier.checkpoint():
            await settle()
            raise OSError("disk full")

    t = asyncio.create_task(failing_checkpoint())
    await asyncio.sleep(0)
    m = Mutator(barrier, log, "m")
    with pytest.raises(OSError, match="disk full"):
        await t
    await settle()
    assert m.entered.is_set()
    m.release.set()
    await m.task
    assert barrier.stats.pending_checkpoints == 0
    assert barrier.stats.checkpoints == 1


async def test_a_mutation_inside_its_own_checkpoint_raises_instead_of_deadlocking() -> None:
    barrier = DataPlaneCheckpointBarrier()
    async with barrier.checkpoint():
        with pytest.raises(RuntimeError, match="deadlock"):
            async with barrier.mutation():
                pass
    async with barrier.mutation():
        with pytest.raises(RuntimeError, match="deadlock"):
            async with barrier.checkpoint():
                pass
    assert barrier.stats.pending_checkpoints == 0
    assert barrier.stats.active_mutations == 0


async def test_stats_report_the_exclusive_window_with_the_injected_clock() -> None:
    now = [100.0]
    barrier = DataPlaneCheckpointBarrier(clock=lambda: now[0])
    assert barrier.stats.last_exclusive_s is None
    log: list[str] = []
    m = Mutator(barrier, log, "m")
    await settle()
    c = Checkpointer(barrier, log, "c")
    await settle()
    now[0] = 102.0  # drain takes 2 s
    m.release.set()
    await settle()
    assert c.entered.is_set()
    now[0] = 102.5  # window takes 0.5 s
    c.release.set()
    await asyncio.gather(m.task, c.task)
    s = barrier.stats
    assert s.checkpoints == 1
    assert s.last_exclusive_s == pytest.approx(0.5)
    assert s.last_hold_s == pytest.approx(2.5)
    assert s.max_exclusive_s == pytest.approx(0.5)
    now[0] = 110.0
    async with barrier.checkpoint():
        now[0] = 110.25
    s = barrier.stats
    assert s.checkpoints == 2
    assert s.last_exclusive_s == pytest.approx(0.25)
    assert s.max_exclusive_s == pytest.approx(0.5)
    assert s.total_exclusive_s == pytest.approx(0.75)
