"""A generation worker's node dies mid-run on a real multi-node Ray: the attempt goes on, and loses nothing.

A Ray cluster of two nodes on this machine (`ray.cluster_utils.Cluster`, real raylets): the head, where the
driver runs, and a generation node that alone has `config.GENERATION_RESOURCE` (what the operator gives a
worker group's pods). The driver attaches to it through RAY_ADDRESS, as it does on a RayJob's head. Removing
the generation node kills its raylet and every process on it, as a worker pod's loss does.

- in_order, the node killed while the driver holds after step 3 (a crash-point hold, so that a fast machine
  cannot finish first) and a new one added a few seconds later: the same attempt finishes,
  its final weights equal an undisturbed run's, every prompt was trained exactly once, and every actor that
  holds run state sat on the head the whole time (nothing of it was on the node that died);
- no generation node comes back within `generation.replacementSeconds`: the driver exits with code 4
  (`GenerationLost`), which the operator treats as a preemption;
- with two generation nodes (a worker group of two pods), the generation workers are spread over both, so that
  one pod's loss takes only its own share of generation.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
import ray.cluster_utils
import torch

from support import launcher, waiting, weights
from support.uninterrupted import References
from trainingrun_runtime import config, contract
from trainingrun_runtime.driver import events, generation_workers, placement
from trainingrun_runtime.rollout import ledger
from trainingrun_runtime.storage import layout, verification

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

STEPS, PROMPTS = 8, 4
CONFIG: dict[str, Any] = {
    "trainer": {
        "steps": STEPS,
        "promptsPerStep": PROMPTS,
        "generationWorkers": 2,
        "logEvery": 1,
        "seed": 7,
        "grpo": {"groupSize": 4},
        "task": {"datasetSize": 48},
        "sampler": {"kind": "in_order"},
    },
    "checkpoint": {"savePeriod": 4, "keepLast": 5},
    "generation": {"onWorkerGroups": True, "replacementSeconds": 120},
}
GENERATION_NODE = {"num_cpus": 2, "resources": {config.GENERATION_RESOURCE: 100}}


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[ray.cluster_utils.Cluster]:
    nodes = ray.cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 6})
    try:
        yield nodes
    finally:
        nodes.shutdown()


@pytest.fixture
def cluster(ray_cluster: ray.cluster_utils.Cluster) -> Iterator[ray.cluster_utils.Cluster]:
    """The module's cluster, with no generation node at the start of the test and none left after it.

    Teardown waits until the GCS has marked the removed nodes dead: until then it still schedules actors on
    them, and the next test's generators would be placed on a node that no longer exists."""
    yield ray_cluster
    for node in list(ray_cluster.worker_nodes):
        ray_cluster.remove_node(node, allow_graceful=False)
    ray_cluster.wait_for_nodes(timeout=120)


def run_driver(
    root: Path, run: str, cluster: ray.cluster_utils.Cluster, conf: dict[str, Any], hold_at: str | None = None
) -> launcher.Driver:
    """The driver of `run`, attached to `cluster`; `hold_at` ("trained@3~20") pauses it there so that the
    test removes the generation node mid-run however fast the steps go on this machine."""
    return launcher.start(run=run, attempt=1, root=root, config=conf, event_log=root / f"{run}.jsonl",
                          env={"RAY_ADDRESS": cluster.address}, crash_at=hold_at)  # fmt: skip


def actor_nodes(cluster: ray.cluster_utils.Cluster, prefix: str) -> dict[str, str]:
    """Name -> node id of every live actor of the run (and of TransferQueue), read from the GCS."""
    from ray.util.state import list_actors

    ray.init(address=cluster.address, namespace="observer", log_to_driver=False)
    try:
        found = list_actors(filters=[("state", "=", "ALIVE")], limit=1000)
    finally:
        ray.shutdown()
    return {a.name: a.node_id for a in found if a.name and (a.name.startswith(prefix) or "TransferQueue" in a.name)}


def test_a_lost_generation_node_costs_no_attempt_no_step_and_no_prompt(
    tmp_path: Path, cluster: ray.cluster_utils.Cluster, uninterrupted: References
) -> None:
    undisturbed = uninterrupted(CONFIG).at(STEPS)  # one generation worker, on a local Ray: the same samples
    generation = cluster.add_node(**GENERATION_NODE)
    killed = run_driver(tmp_path, "killed", cluster, CONFIG, hold_at="trained@3~20")
    log = tmp_path / "killed.jsonl"
    killed.wait_for_marker("trained", 3, timeout=400, held=True)
    head = cluster.head_node.node_id
    state = {n: node for n, node in actor_nodes(cluster, "killed-a1").items() if "-gen-" not in n}
    assert set(state) >= {"killed-a1-controller", "killed-a1-trainer", "TransferQueueController",
                          "TransferQueueStorageUnit#0", "TransferQueueStorageUnit#1"}, state  # fmt: skip
    assert set(state.values()) == {head}, "run state must live on the head, never on a generation node"
    cluster.remove_node(generation, allow_graceful=False)
    waiting.wait(lambda: any(e["event"] == "generator_lost" for e in events.read(log)), timeout=60,
                 what="the controller noticing the lost workers",
                 diagnostics=lambda: killed.output()[-3000:])  # fmt: skip
    cluster.add_node(**GENERATION_NODE)
    assert killed.wait(600) == 0, killed.output()[-3000:]

    by_event: dict[str, list[dict[str, Any]]] = {}
    for e in events.read(log):
        by_event.setdefault(e["event"], []).append(e)
    assert len(by_event["generator_replaced"]) >= 1
    assert by_event["finished"][-1]["weights_sha256"] == undisturbed
    weights.assert_moved(
        {m.step: m.weights_sha256 for m in map(verification.verify, (tmp_path / "killed").glob("step_*"))}
    )
    last = verification.open_verified(tmp_path / "killed" / layout.step_dirname(STEPS))
    index_file = torch.load(last.replay_metadata, weights_only=True)
    book = ledger.Ledger()
    book.load_state_dict(index_file["restart"]["ledger"])
    assert book.in_state(ledger.State.CONSUMED) == list(range(STEPS * PROMPTS))
    book.check_served(index_file["restart"]["loader"]["next_uid"])


def test_no_generation_node_back_within_the_bound_ends_the_attempt_with_exit_code_4(
    tmp_path: Path, cluster: ray.cluster_utils.Cluster
) -> None:
    generation = cluster.add_node(**GENERATION_NODE)
    conf = json.loads(json.dumps(CONFIG))
    conf["generation"]["replacementSeconds"] = 30  # also the bound on the first workers starting
    proc = run_driver(tmp_path, "gone", cluster, conf, hold_at="trained@2~10")
    proc.wait_for_marker("trained", 2, timeout=400, held=True)
    cluster.remove_node(generation, allow_graceful=False)
    assert proc.wait(300) == contract.Exit.GENERATION_LOST, proc.output()[-3000:]
    assert "GenerationLost: no generation worker for 30 s" in proc.output()


def test_generation_workers_are_spread_over_the_generation_nodes(cluster: ray.cluster_utils.Cluster) -> None:
    nodes = {cluster.add_node(**GENERATION_NODE).node_id for _ in range(2)}
    cluster.wait_for_nodes(timeout=120)
    conf = config.RuntimeConfig.model_validate(CONFIG)
    ray.init(address=cluster.address, namespace="spread", log_to_driver=False)
    try:
        options = placement.generation(conf.generation)
        actors = [generation_workers.spawn(conf.trainer, f"spread-gen-{i}", options) for i in range(2)]
        ray.get([a.__ray_ready__.remote() for a in actors], timeout=120)
        from ray.util.state import list_actors

        found = list_actors(filters=[("state", "=", "ALIVE")], limit=1000)
        placed = {a.name: a.node_id for a in found if a.name and a.name.startswith("spread-gen-")}
        for actor in actors:
            ray.kill(actor)
    finally:
        ray.shutdown()
    assert set(placed) == {"spread-gen-0", "spread-gen-1"}, placed
    assert set(placed.values()) == nodes, f"both generation workers on one node: {placed}"


TRAINER_NODE = {"num_cpus": 1, "resources": {config.TRAINER_RESOURCE: 1}}


def test_trainer_ranks_run_one_a_trainer_node_and_losing_one_ends_the_attempt_with_exit_code_8(
    tmp_path: Path, cluster: ray.cluster_utils.Cluster
) -> None:
    """Two trainer ranks on the nodes of a worker group of role trainer (what the operator gives its pods: one
    unit of `config.TRAINER_RESOURCE` each), one a node; the rest of the run state on the head. Removing one of
    those nodes ends the attempt with `TrainerLost` (code 8), which the operator treats as a preemption."""
    cluster.add_node(**GENERATION_NODE)
    ranks = [cluster.add_node(**TRAINER_NODE) for _ in range(2)]
    conf = json.loads(json.dumps(CONFIG))
    conf["trainer"]["trainerWorkers"] = 2
    conf["trainers"] = {"onWorkerGroups": True}
    driver = run_driver(tmp_path, "ranks", cluster, conf, hold_at="trained@3~15")
    driver.wait_for_marker("trained", 3, timeout=400, held=True)
    where = actor_nodes(cluster, "ranks-a1")
    assert {where["ranks-a1-trainer"], where["ranks-a1-trainer-1"]} == {n.node_id for n in ranks}, where
    state = {name: node for name, node in where.items() if "-gen-" not in name and "-trainer" not in name}
    assert set(state.values()) == {cluster.head_node.node_id}, state
    cluster.remove_node(ranks[1], allow_graceful=False)
    assert driver.wait(300) == contract.Exit.TRAINER_LOST, driver.output()[-3000:]
    assert contract.said_after(contract.Prefix.TRAINER_LOST, driver.output()), driver.output()[-3000:]
