"""TQReplayBuffer over an in-memory row store: the barrier, rollback of failed and cancelled puts, rebuild.

The row store here is a plain dict standing in for the data plane so these run without Ray in
milliseconds; the same buffer against real TransferQueue is covered by tests/integration.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from support.loop import settle
from trainingrun_runtime.dataplane.barrier import DataPlaneCheckpointBarrier
from trainingrun_runtime.dataplane.replay_buffer import TQReplayBuffer
from trainingrun_runtime.dataplane.replay_index import GroupRows
from trainingrun_runtime.errors import DataPlaneError, PreflightError

pytestmark = pytest.mark.timeout(20)


class MemoryRows:
    """Rows by sample id; `fail_put` makes the next put raise, `gate` holds puts until set."""

    def __init__(self) -> None:
        self.rows: dict[str, Any] = {}
        self.calls: list[str] = []
        self.fail_put = False
        self.gate = threading.Event()
        self.gate.set()
        self.put_started = threading.Event()

    def put_groups(
        self,
        partition: str,
        groups: Sequence[GroupRows],
        fields: Mapping[str, Any],
        tags: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        self.calls.append("put")
        self.put_started.set()
        self.gate.wait(10)
        if self.fail_put:
            raise DataPlaneError("storage unit unreachable")
        ids = [s for g in groups for s in g.sample_ids]
        for i, sid in enumerate(ids):
            self.rows[sid] = {k: v[i] for k, v in fields.items()}

    def clear_groups(self, partition: str, groups: Sequence[GroupRows]) -> None:
        self.calls.append("clear")
        for g in groups:
            for sid in g.sample_ids:
                del self.rows[sid]

    def list_sample_ids(self, partition: str) -> list[str]:
        self.calls.append("list")
        return sorted(self.rows)


def make_buffer(store: MemoryRows | None = None) -> tuple[TQReplayBuffer, MemoryRows, DataPlaneCheckpointBarrier]:
    store = store or MemoryRows()
    barrier = DataPlaneCheckpointBarrier()
    return TQReplayBuffer(store, barrier, partition="train", group_size=2, capacity=4), store, barrier


async def test_commit_stores_the_whole_group_and_remove_clears_it() -> None:
    buffer, store, _ = make_buffer()
    await buffer.reserve("g0", meta={"prompt": 0})
    await buffer.commit("g0", {"reward": [1.0, 0.0]})
    assert sorted(store.rows) == ["g0:0", "g0:1"]
    assert [g.group_id for g in buffer.groups()] == ["g0"]
    await buffer.remove_group("g0")
    assert store.rows == {}
    assert len(buffer) == 0


async def test_a_failed_put_drops_the_reservation() -> None:
    buffer, store, _ = make_buffer()
    await buffer.reserve("g0")
    store.fail_put = True
    with pytest.raises(DataPlaneError, match="unreachable"):
        await buffer.commit("g0", {"reward": [1.0, 0.0]})
    assert "g0" not in buffer.index
    assert store.rows == {}
    store.fail_put = False
    await buffer.reserve("g0")  # the ids are free again
    await buffer.commit("g0", {"reward": [1.0, 0.0]})
    assert len(buffer) == 1


async def test_a_cancelled_commit_waits_for_the_put_then_removes_its_rows() -> None:
    buffer, store, barrier = make_buffer()
    await buffer.reserve("g0")
    store.gate.clear()
    task = asyncio.create_task(buffer.commit("g0", {"reward": [1.0, 0.0]}))
    await asyncio.to_thread(store.put_started.wait, 5)
    task.cancel()
    await settle()  # the cancellation has had its turns
    assert not task.done()  # still inside its mutation window: the put cannot be stopped
    assert barrier.stats.active_mutations == 1
    store.gate.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert store.calls == ["put", "clear"]
    assert store.rows == {}
    assert "g0" not in buffer.index
    assert barrier.stats.active_mutations == 0


async def test_a_checkpoint_window_holds_commits_back_until_it_closes() -> None:
    buffer, store, barrier = make_buffer()
    await buffer.reserve("g0")
    seen: list[str] = []
    async with barrier.checkpoint():
        commit = asyncio.create_task(buffer.commit("g0", {"reward": [1.0, 0.0]}))
        await settle()  # the commit has had its turns: it waits at the barrier
        seen.append(f"inside: {sorted(store.rows)}")
        state = buffer.metadata_state_dict()
    await commit
    assert seen == ["inside: []"]
    assert state["groups"] == []
    assert [g["group_id"] for g in buffer.metadata_state_dict()["groups"]] == ["g0"]


async def test_remove_and_cancel_refuse_the_wrong_kind_of_group() -> None:
    buffer, _, _ = make_buffer()
    await buffer.reserve("pending")
    await buffer.reserve("done")
    await buffer.commit("done", {"reward": [1.0, 0.0]})
    with pytest.raises(DataPlaneError, match="only reserved; use cancel"):
        await buffer.remove_group("pending")
    with pytest.raises(DataPlaneError, match="committed; use remove_group"):
        await buffer.cancel("done")
    await buffer.cancel("pending")
    assert [r.group_id for r in buffer.index.reserved()] == []


async def test_restore_reads_the_stored_ids_and_never_writes() -> None:
    source, store, _ = make_buffer()
    for g in range(3):
        await source.reserve(f"g{g}")
        await source.commit(f"g{g}", {"reward": [1.0, 0.0]})
    state = source.metadata_state_dict()

    rebuilt, _, _ = make_buffer(store)
    store.calls.clear()
    await rebuilt.restore(state, expected_digest=state["digest"])
    assert store.calls == ["list"]
    assert rebuilt.metadata_state_dict() == state


async def test_restore_refuses_when_the_stored_rows_differ() -> None:
    source, store, _ = make_buffer()
    await source.reserve("g0")
    await source.commit("g0", {"reward": [1.0, 0.0]})
    state = source.metadata_state_dict()
    del store.rows["g0:1"]
    rebuilt, _, _ = make_buffer(store)
    with pytest.raises(PreflightError, match=r"1 indexed but not stored \['g0:1'\]"):
        await rebuilt.restore(state, expected_digest=state["digest"])
    assert len(rebuilt) == 0


async def test_rebuild_only_into_an_empty_buffer() -> None:
    buffer, _, _ = make_buffer()
    await buffer.reserve("g0")
    with pytest.raises(PreflightError, match="already holds groups"):
        buffer.load_state_dict(buffer.metadata_state_dict())
