"""The replay buffer: the replay index with its rows in TransferQueue, every change behind the checkpoint barrier.

Each operation runs inside `barrier.mutation()`::

    reserve(group)        index only: claim capacity and sample ids for a group being generated
    commit(group, rows)   put the whole group into TQ, then mark it committed; a failed or
                          cancelled put removes its rows again and drops the reservation
    remove_group(group)   clear the whole group from TQ, then drop it from the index
    cancel(group)         drop a reservation that will never be committed

A checkpoint (`checkpointer`) takes `barrier.checkpoint()`, so it sees no operation half-done: the index it
captures names exactly the rows TransferQueue stores. Pure asyncio over a `RowStore` (the data plane's row client
in production); no Ray, torch or TransferQueue import here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from trainingrun_runtime.dataplane.barrier import DataPlaneCheckpointBarrier
from trainingrun_runtime.dataplane.replay_index import GroupRecord, GroupRows, ReplayConfig, ReplayIndex
from trainingrun_runtime.errors import DataPlaneError, PreflightError

__all__ = ["RowStore", "TQReplayBuffer", "run_blocking"]

_T = TypeVar("_T")


class RowStore(Protocol):
    """What the buffer needs from the data plane (`row_client.DataPlaneClient` provides it; blocking calls)."""

    def put_groups(
        self,
        partition: str,
        groups: Sequence[GroupRows],
        fields: Mapping[str, Any],
        tags: Sequence[Mapping[str, Any]] | None = None,
    ) -> None: ...

    def clear_groups(self, partition: str, groups: Sequence[GroupRows]) -> None: ...

    def list_sample_ids(self, partition: str) -> list[str]: ...


class TQReplayBuffer:
    """The replay index with its rows in TransferQueue; every change runs inside `barrier.mutation()`."""

    def __init__(
        self,
        store: RowStore,
        barrier: DataPlaneCheckpointBarrier,
        *,
        partition: str,
        group_size: int,
        capacity: int,
    ) -> None:
        self._store = store
        self._barrier = barrier
        self._index = ReplayIndex(partition=partition, group_size=group_size, capacity=capacity)

    @property
    def partition(self) -> str:
        """The TransferQueue partition holding this buffer's rows."""
        return self._index.partition

    @property
    def barrier(self) -> DataPlaneCheckpointBarrier:
        """The barrier every change of this buffer goes through (the checkpoint takes its exclusive side)."""
        return self._barrier

    @property
    def config(self) -> ReplayConfig:
        """Partition, group size and capacity (what a restore preflights against)."""
        return ReplayConfig(self._index.partition, self._index.group_size, self._index.capacity)

    @property
    def index(self) -> ReplayIndex:
        """The index (read it; change it only through this buffer)."""
        return self._index

    def __len__(self) -> int:
        return len(self._index)

    def groups(self) -> Iterator[GroupRecord]:
        """Committed groups, oldest first."""
        return iter(self._index.committed())

    async def reserve(
        self, group_id: str, sample_ids: Sequence[str] | None = None, meta: Mapping[str, Any] | None = None
    ) -> GroupRecord:
        """Claim capacity and sample ids for a group about to be generated (no TQ write)."""
        async with self._barrier.mutation():
            return self._index.reserve(group_id, sample_ids, meta)

    async def commit(
        self, group_id: str, fields: Mapping[str, Any], tags: Sequence[Mapping[str, Any]] | None = None
    ) -> GroupRecord:
        """Put a reserved group's rows into TQ (batched over its members), then mark it committed.

        On failure or cancellation no row of the group stays in TQ and the reservation is dropped.
        """
        async with self._barrier.mutation():
            record = self._index.get(group_id)
            if record.committed:
                raise DataPlaneError(f"group {group_id!r} is already committed")
            try:
                await run_blocking(
                    lambda: self._store.put_groups(self.partition, [record.rows], fields, tags),
                    undo=lambda: self._store.clear_groups(self.partition, [record.rows]),
                )
            except BaseException:
                self._index.release(group_id)
                raise
            return self._index.commit(group_id)

    async def cancel(self, group_id: str) -> GroupRecord:
        """Drop a reservation whose group will never be committed."""
        async with self._barrier.mutation():
            if self._index.get(group_id).committed:
                raise DataPlaneError(f"group {group_id!r} is committed; use remove_group")
            return self._index.release(group_id)

    async def remove_group(self, group_id: str) -> GroupRecord:
        """Clear a committed group's rows from TQ, then drop it from the index."""
        async with self._barrier.mutation():
            record = self._index.get(group_id)
            if not record.committed:
                raise DataPlaneError(f"group {group_id!r} is only reserved; use cancel")
            await run_blocking(lambda: self._store.clear_groups(self.partition, [record.rows]))
            return self._index.release(group_id)

    def metadata_state_dict(self) -> dict[str, Any]:
        """The index (committed groups) as JSON values; call inside the checkpoint window."""
        return self._index.state_dict()

    def load_state_dict(
        self,
        state: Mapping[str, Any],
        *,
        stored_ids: Collection[str] | None = None,
        expected_digest: str | None = None,
        where: str = "replay_buffer_metadata.pt",
    ) -> None:
        """Rebuild the index from a state dict after preflight; never writes to TQ; the buffer must be empty."""
        if len(self._index._groups):
            raise PreflightError(f"{where}: the replay buffer already holds groups; rebuild only an empty one")
        self._index = ReplayIndex.from_state_dict(
            state,
            partition=self._index.partition,
            group_size=self._index.group_size,
            capacity=self._index.capacity,
            stored_ids=stored_ids,
            expected_digest=expected_digest,
            where=where,
        )

    async def restore(
        self, state: Mapping[str, Any], *, expected_digest: str | None, where: str = "replay_buffer_metadata.pt"
    ) -> None:
        """Rebuild the index and check it against the rows TQ holds (one metadata read, no write)."""
        stored = await asyncio.to_thread(self._store.list_sample_ids, self.partition)
        self.load_state_dict(state, stored_ids=stored, expected_digest=expected_digest, where=where)


async def run_blocking(fn: Callable[[], _T], *, undo: Callable[[], object] | None = None) -> _T:
    """Run a blocking data-plane call in a thread; if cancelled, wait for it, undo a success, re-raise.

    A thread cannot be stopped, so returning early on cancellation would let the call land
    after the index was rolled back and leave TQ and the index out of step.
    """
    future = asyncio.ensure_future(asyncio.to_thread(fn))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        await _wait_out(future)
        if undo is not None and not future.cancelled() and future.exception() is None:
            await _wait_out(asyncio.ensure_future(asyncio.to_thread(undo)))
        raise


async def _wait_out(future: asyncio.Future[Any]) -> None:
    """Wait until `future` is done, through further cancellations (the caller re-raises the first one)."""
    while not future.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({future})
