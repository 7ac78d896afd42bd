"""Where each Ray actor of a run goes: everything that holds run state on the head, generation on the worker groups.

    on the driver's node (the head pod), with hard node affinity:
        the controller actor, TransferQueue's controller and its storage units, and the trainer workers (the
        data-parallel ranks) unless the run has worker groups of role trainer
    trainer ranks, when it has them: one unit of `config.TRAINER_RESOURCE` each, which only those groups' nodes have
        (one unit a node: one rank a pod); a rank's node lost ends the attempt (TrainerLost: its state is one
        with the other ranks', and it is in the checkpoint)
    generation workers:
        the run has worker groups -> one unit of `config.GENERATION_RESOURCE` each, which only the worker groups'
                                     nodes have (the operator puts it into their rayStartParams), spread over
                                     those nodes (Ray's SPREAD): with 1000 units a node, Ray's default policy
                                     would pack them all onto the first worker pod, so that losing that one pod
                                     took every generation worker while the others idled
        it has none (local mode, the tiny example) -> beside the driver

So losing a worker pod loses no state: only generation workers can be on it, and the controller replaces them
(`controller`). The driver always runs on the head: KubeRay submits it to the head's job server.

GPUs (`gpus`): each trainer rank asks for one when the head has one for every rank, and each generation worker asks
for one when every node it may run on has one (on the head: one per trainer rank and one per generation worker), so
that Ray gives the actor its device (CUDA_VISIBLE_DEVICES) and the model goes onto it (`grpo.workload.device`);
otherwise they run on the CPU. KubeRay gives each pod's Ray the GPUs of its `nvidia.com/gpu` limit. Not measured on
a GPU here: the test machine has none.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from trainingrun_runtime import config

__all__ = ["Gpus", "generation", "gpus", "head_node", "on_head", "trainer"]


def head_node() -> str:
    """The Ray node id of this process (on the driver: the head)."""
    import ray

    return str(ray.get_runtime_context().get_node_id())


def on_head(node_id: str) -> dict[str, Any]:
    """Actor options that place an actor on the head and nowhere else (it never moves: it holds run state)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)}


@dataclasses.dataclass(frozen=True)
class Gpus:
    """How many GPUs the trainer and each generation worker ask Ray for (0 or 1)."""

    trainer: int = 0
    generator: int = 0


def gpus(
    nodes: Sequence[Mapping[str, Any]],
    head: str,
    cfg: config.GenerationConfig,
    generation_workers: int,
    trainer_workers: int = 1,
    trainers: config.TrainersConfig | None = None,
) -> Gpus:
    """The GPUs to ask for, from Ray's nodes (`ray.nodes()`: NodeID, Alive, Resources); see the module. `trainer` is
    per trainer rank: on the head, each gets one only when the head has one for every rank; on the trainer worker
    groups (one rank a node), when every node of theirs has one."""
    alive = [n for n in nodes if n.get("Alive", True)]

    def gpus_of(node: Mapping[str, Any]) -> float:
        return float((node.get("Resources") or {}).get("GPU", 0))

    on_head = sum(gpus_of(n) for n in alive if n.get("NodeID") == head)
    if trainers is not None and trainers.on_worker_groups:
        ranks = [n for n in alive if config.TRAINER_RESOURCE in (n.get("Resources") or {})]
        trainer = 1 if ranks and all(gpus_of(n) >= 1 for n in ranks) else 0
        generator = _generator_gpus(alive, on_head, cfg, generation_workers, gpus_of)
        return Gpus(trainer=trainer, generator=generator)
    trainer = 1 if on_head >= trainer_workers else 0
    if cfg.on_worker_groups:
        generator = _generator_gpus(alive, on_head, cfg, generation_workers, gpus_of)
    else:
        generator = 1 if on_head >= trainer * trainer_workers + generation_workers else 0
    return Gpus(trainer=trainer, generator=generator)


def _generator_gpus(
    alive: Sequence[Mapping[str, Any]],
    on_head: float,
    cfg: config.GenerationConfig,
    generation_workers: int,
    gpus_of: Any,
) -> int:
    """A generation worker's GPU when the head holds no trainer rank's (`gpus`)."""
    if cfg.on_worker_groups:
        workers = [n for n in alive if config.GENERATION_RESOURCE in (n.get("Resources") or {})]
        return 1 if workers and all(gpus_of(n) >= 1 for n in workers) else 0
    return 1 if on_head >= generation_workers else 0


def trainer(trainers: config.TrainersConfig, head: str, num_gpus: int = 0) -> dict[str, Any]:
    """Actor options for a trainer rank: on the head (hard affinity), or one unit of `config.TRAINER_RESOURCE` on the
    trainer worker groups (one rank a node); with `num_gpus` GPUs (`gpus`)."""
    options: dict[str, Any] = {"num_gpus": num_gpus}
    if trainers.on_worker_groups:
        return {**options, "resources": {config.TRAINER_RESOURCE: 1}}
    return {**options, **on_head(head)}


def generation(cfg: config.GenerationConfig, num_gpus: int = 0) -> dict[str, Any]:
    """Actor options for a generation worker: on the worker groups when the run has them, else anywhere; with
    `num_gpus` GPUs (`gpus`)."""
    options: dict[str, Any] = {"num_gpus": num_gpus} if num_gpus else {}
    if not cfg.on_worker_groups:
        return options
    return {**options, "resources": {config.GENERATION_RESOURCE: 1}, "scheduling_strategy": "SPREAD"}
