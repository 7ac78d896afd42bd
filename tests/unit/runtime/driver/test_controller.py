"""The controller's task supervision: the first failure stops the others and is raised as it was."""

from __future__ import annotations

import asyncio

import pytest

from trainingrun_runtime.driver import controller


async def test_a_failing_task_stops_the_others_and_its_own_error_is_raised() -> None:
    stopped = asyncio.Event()

    async def lane() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            stopped.set()
            raise

    async def pump() -> None:
        await asyncio.sleep(0.01)
        raise KeyError("the original error")

    tasks = {asyncio.create_task(lane(), name="rollout-lane-0"), asyncio.create_task(pump(), name="train-pump")}
    with pytest.raises(KeyError, match="the original error"):
        await controller._supervise(tasks, until="train-pump")
    assert stopped.is_set()


async def test_when_the_train_pump_finishes_the_lanes_are_cancelled() -> None:
    async def lane() -> None:
        await asyncio.sleep(3600)

    async def pump() -> None:
        await asyncio.sleep(0.01)

    lane_task = asyncio.create_task(lane(), name="rollout-lane-0")
    await controller._supervise({lane_task, asyncio.create_task(pump(), name="train-pump")}, until="train-pump")
    assert lane_task.cancelled()


async def test_a_lane_that_returns_on_its_own_is_an_error() -> None:
    async def lane() -> None:
        return None

    async def pump() -> None:
        await asyncio.sleep(3600)

    with pytest.raises(RuntimeError, match="rollout-lane-0 ended on their own"):
        await controller._supervise(
            {asyncio.create_task(lane(), name="rollout-lane-0"), asyncio.create_task(pump(), name="train-pump")},
            until="train-pump",
        )
