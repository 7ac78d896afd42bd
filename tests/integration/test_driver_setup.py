"""`setup.setup_single_controller` in this process on real local Ray, TransferQueue and torch: a setup that fails
after Ray started leaves nothing running (the trainer worker, TransferQueue, the generation workers)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from support import waiting
from trainingrun_runtime import config
from trainingrun_runtime.driver import events, setup

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

RUN = "leak"
CONFIG: dict[str, Any] = {
    "trainer": {"steps": 2, "promptsPerStep": 4, "generationWorkers": 1, "grpo": {"groupSize": 4}},
    "checkpoint": {"savePeriod": 2},
}


@ray.remote(num_cpus=0)
class Squatter:
    """An actor that holds a name."""


def idle_workers() -> list[int]:
    """The pids of this process's local Ray's worker processes that host nothing (`ray::IDLE`)."""
    raylet = ray._private.worker._global_node.all_processes["raylet"][0].process.pid
    found = []
    for proc in Path("/proc").iterdir():
        try:
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (proc / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue  # not a process, or one that has just exited
        if parent == raylet and command.startswith(b"ray::IDLE"):
            found.append(int(proc.name))
    return found


@pytest.fixture
def ray_shut_down_after(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # a local Ray of the setup's own
    yield
    ray.shutdown()


def test_a_setup_whose_controller_actor_cannot_be_created_stops_the_trainers_and_generators_it_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ray_shut_down_after: None
) -> None:
    opts = setup.DriverOptions(
        run=RUN, namespace="default", attempt=1, resume="latest", root=str(tmp_path), reporter="file",
        config=config.RuntimeConfig.model_validate(CONFIG), num_cpus=4,
    )  # fmt: skip
    controller_name = f"{RUN}-a1-controller"
    start_ray = setup._init_ray
    squatter: list[Any] = []  # its handle, held: an actor whose handles are all gone is stopped

    def start_ray_with_the_controllers_name_taken(o: setup.DriverOptions) -> None:
        start_ray(o)
        squatter.append(Squatter.options(name=controller_name).remote())  # type: ignore[attr-defined]

    monkeypatch.setattr(setup, "_init_ray", start_ray_with_the_controllers_name_taken)
    ev = events.EventLog(tmp_path / "events.jsonl")

    with pytest.raises(ValueError, match="already taken"):
        setup.setup_single_controller(opts, ev)

    # The setup got as far as the controller: the trainer, TransferQueue and the generation worker were up.
    assert [e["event"] for e in events.read(tmp_path / "events.jsonl")][-2:] == ["tq_fresh", "generators_ready"]
    # Each worker process of the local Ray hosts one of them: none was started ahead to idle.
    assert idle_workers() == [], idle_workers()
    waiting.wait(
        lambda: set(ray.util.list_named_actors()) == {controller_name},
        timeout=60,
        what="no named actor but the squatter",
        diagnostics=lambda: f"named actors alive: {sorted(ray.util.list_named_actors())}",
    )
