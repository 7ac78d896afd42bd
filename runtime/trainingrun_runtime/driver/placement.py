"""Where each Ray actor of a run goes: everything that holds run state on the head, generation on the worker groups.

    on the driver's node (the head pod), with hard node affinity:
        the controller actor, the trainer worker, TransferQueue's controller and its storage units
    generation workers:
        the run has worker groups -> one unit of `config.GENERATION_RESOURCE` each, which only the worker groups'
                                     nodes have (the operator puts it into their rayStartParams), spread over
                                     those nodes (Ray's SPREAD): with 1000 units a node, Ray's default policy
                                     would pack them all onto the first worker pod, so that losing that one pod
                                     took every generation worker while the others idled
        it has none (local mode, the tiny example) -> beside the driver

So losing a worker pod loses no state: only generation workers can be on it, and the controller replaces them
(`controller`). The driver always runs on the head: KubeRay submits it to the head's job server.
"""

from __future__ import annotations

from typing import Any

from trainingrun_runtime import config

__all__ = ["generation", "head_node", "on_head"]


def head_node() -> str:
    """The Ray node id of this process (on the driver: the head)."""
    import ray

    return str(ray.get_runtime_context().get_node_id())


def on_head(node_id: str) -> dict[str, Any]:
    """Actor options that place an actor on the head and nowhere else (it never moves: it holds run state)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)}


def generation(cfg: config.GenerationConfig) -> dict[str, Any]:
    """Actor options for a generation worker: on the worker groups when the run has them, else anywhere."""
    if not cfg.on_worker_groups:
        return {}
    return {"resources": {config.GENERATION_RESOURCE: 1}, "scheduling_strategy": "SPREAD"}
