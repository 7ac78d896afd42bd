"""Which GPUs the trainer and the generation workers ask Ray for, from Ray's view of the nodes (no Ray here: the
nodes are written as `ray.nodes()` gives them). Not run on a GPU: the test machine has none."""

from __future__ import annotations

from typing import Any

import pytest

from trainingrun_runtime import config
from trainingrun_runtime.driver import placement

LOCAL = config.GenerationConfig()
GROUPS = config.GenerationConfig(on_worker_groups=True)


def node(node_id: str, gpus: float = 0, *, generation: bool = False, alive: bool = True) -> dict[str, Any]:
    resources: dict[str, float] = {"CPU": 8.0}
    if gpus:
        resources["GPU"] = gpus
    if generation:
        resources[config.GENERATION_RESOURCE] = 1000.0
    return {"NodeID": node_id, "Alive": alive, "Resources": resources}


@pytest.mark.parametrize(
    ("nodes", "cfg", "workers", "wanted"),
    [
        ([node("head")], LOCAL, 2, placement.Gpus(0, 0)),  # a laptop, the test machine
        ([node("head", 1)], LOCAL, 2, placement.Gpus(1, 0)),  # one GPU: the trainer's
        ([node("head", 3)], LOCAL, 2, placement.Gpus(1, 1)),  # one each
        (
            [node("head", 1), node("w1", 1, generation=True), node("w2", 1, generation=True)],
            GROUPS,
            4,
            placement.Gpus(1, 1),
        ),
        (
            [node("head"), node("w1", 1, generation=True), node("w2", 0, generation=True)],
            GROUPS,
            2,
            placement.Gpus(0, 0),
        ),
        (
            [node("head"), node("w1", 1, generation=True), node("w2", 0, generation=True, alive=False)],
            GROUPS,
            2,
            placement.Gpus(0, 1),
        ),  # a lost worker pod does not count
        ([node("head", 8)], GROUPS, 2, placement.Gpus(1, 0)),  # no worker node up yet: CPU, not a wait for ever
    ],
)
def test_an_actor_asks_for_a_gpu_only_where_every_node_it_may_run_on_has_one(
    nodes: list[dict[str, Any]], cfg: config.GenerationConfig, workers: int, wanted: placement.Gpus
) -> None:
    assert placement.gpus(nodes, "head", cfg, workers) == wanted


@pytest.mark.parametrize(
    ("head_gpus", "wanted"),
    [
        (1, placement.Gpus(0, 0)),  # not one for each of the 2 ranks: all on the CPU, not 1 rank waiting for ever
        (2, placement.Gpus(1, 0)),  # one per rank; none left for the generators
        (4, placement.Gpus(1, 1)),  # one per rank and one per generation worker
    ],
)
def test_each_trainer_rank_gets_a_gpu_only_when_the_head_has_one_for_every_rank(
    head_gpus: int, wanted: placement.Gpus
) -> None:
    assert placement.gpus([node("head", head_gpus)], "head", LOCAL, 2, trainer_workers=2) == wanted


def test_the_generation_options_carry_the_gpu_and_keep_the_worker_groups_placement() -> None:
    assert placement.generation(LOCAL) == {}
    assert placement.generation(LOCAL, 1) == {"num_gpus": 1}
    assert placement.generation(GROUPS, 1) == {
        "num_gpus": 1,
        "resources": {config.GENERATION_RESOURCE: 1},
        "scheduling_strategy": "SPREAD",
    }


def test_a_trainer_rank_asks_for_one_unit_of_the_trainer_resource_when_the_ranks_run_on_worker_groups() -> None:
    on_groups = config.TrainersConfig(on_worker_groups=True)
    assert placement.trainer(on_groups, "head", 1) == {"num_gpus": 1, "resources": {config.TRAINER_RESOURCE: 1}}


def trainer_node(node_id: str, gpus: float) -> dict[str, Any]:
    found = node(node_id, gpus)
    found["Resources"][config.TRAINER_RESOURCE] = 1.0
    return found


def test_a_trainer_rank_on_a_trainer_node_gets_a_gpu_only_when_every_trainer_node_has_one() -> None:
    on_groups = config.TrainersConfig(on_worker_groups=True)
    nodes = [node("head", 0), trainer_node("t1", 1), trainer_node("t2", 1)]
    assert placement.gpus(nodes, "head", LOCAL, 1, 2, on_groups) == placement.Gpus(1, 0)
    nodes.append(trainer_node("t3", 0))
    assert placement.gpus(nodes, "head", LOCAL, 1, 2, on_groups) == placement.Gpus(0, 0)
