"""The entrypoint's argument and config errors (exit code 2, no Ray started) and task supervision."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from trainingrun_runtime.driver import controller, entrypoint


def _argv(tmp_path: Path, config_json: str) -> list[str]:
    return ["--run", "r", "--attempt", "1", "--root", str(tmp_path), "--config-json", config_json]


def test_an_unknown_config_field_exits_2_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert entrypoint.main(_argv(tmp_path, '{"trainer": {"grpo": {"clipEpsilon": 0.1}}}')) == entrypoint.EXIT_BAD_CONFIG
    err = capsys.readouterr().err
    assert err.startswith("BadConfig:") and "clipEpsilon" in err


def test_malformed_json_and_a_bad_resume_exit_2(tmp_path: Path) -> None:
    assert entrypoint.main(_argv(tmp_path, "{not json")) == entrypoint.EXIT_BAD_CONFIG
    assert entrypoint.main([*_argv(tmp_path, "{}"), "--resume", "yesterday"]) == entrypoint.EXIT_BAD_CONFIG


def test_a_missing_required_argument_is_a_usage_error_with_exit_2(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        entrypoint.main(["--run", "r", "--root", str(tmp_path), "--config-json", "{}"])
    assert exc.value.code == 2


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


def test_an_index_rebuild_failure_in_the_actor_is_a_failed_restore_and_a_superseded_driver_is_not() -> None:
    from trainingrun_runtime.driver import entrypoint
    from trainingrun_runtime.storage import fence
    from trainingrun_runtime.errors import DataPlaneError, DigestError, PreflightError, Superseded

    assert entrypoint.is_restore_error(PreflightError("ledger disagrees with the index"))
    assert entrypoint.is_restore_error(DigestError("digest mismatch"))
    assert not entrypoint.is_restore_error(Superseded("attempt 3 owns the directory"))
    assert not entrypoint.is_restore_error(DataPlaneError("snapshot failed"))
