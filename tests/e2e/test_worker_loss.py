"""A spot worker's loss on the full loop costs the run no attempt and no step: the cluster-shaped example (the head
on a node of its own, a worker group "generation" of 2 replicas on the bed's worker node), the real KubeRay, our
operator and the real driver.

- Worker pods evicted three times at seeded random moments (E2E_CHAOS_SEED replays them), one at a save step:
  attempt 1 finishes, KubeRay recreated the pods, the final weights equal an undisturbed run's (in_order), every
  prompt was consumed exactly once, and each evicted pod's Ray processes died with it.
- The worker node stops heartbeating (its kwok stops, its processes are killed) and is replaced: same outcome.
- The head's node stops heartbeating for less than `nodeNotReadySeconds` while Ray keeps running: the attempt
  goes on.
- A trainer pod's loss is not a spot worker's: with 2 trainer workers in a worker group of role trainer (one rank a
  pod), one of those pods evicted without a grace period at a seeded random step ends attempt 1 as Preempted
  (TrainerLost), attempt 2 resumes from the newest recorded step on 2 ranks again, and the run ends with the weights
  of the uninterrupted 2-worker run.

Every worker gone for longer than `workerReplacementSeconds` is proven in its parts, each once and cheaper: the bound
reaches the driver's config (tests/unit/operator/test_rayjob.py), the driver exits 4 when no generation node is back
within it (tests/integration/test_generation_fleet.py, real Ray), and the operator ends that attempt Preempted and
resumes from the recorded step (tests/integration/test_operator_disruptions.py, the real API server).
"""

from __future__ import annotations

import random
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

import pytest
import torch

import chaos
import examples
import localpod
from support import journeys, seeds, weights
from support.uninterrupted import References
from trainingrun_runtime.rollout import ledger
from trainingrun_runtime.storage import layout, verification

if TYPE_CHECKING:
    from conftest import Loop  # tests/e2e/conftest.py

pytestmark = pytest.mark.e2e


SEED = 1301  # the default seed of the evictions' moments (E2E_CHAOS_SEED overrides it; support/seeds.py)
STEPS, SAVE_PERIOD, PROMPTS = 36, 6, 8
RUN_TRAINER = {"steps": STEPS, "logEvery": 2}


@pytest.fixture(scope="module")
def undisturbed(uninterrupted: References, full_loop: Any) -> str:
    """weights_sha256 of the same trainer config trained without any disruption (the session's reference on a local
    Ray: the number and place of the generation workers never change a sample), at the last step."""
    trainer = examples.tiny_run("ref", generationWorkers=2, **RUN_TRAINER)["spec"]["trainer"]
    return uninterrupted({"trainer": trainer}, steps=journeys.REFERENCE_STEPS).at(STEPS)


def runtime_step(loop: Loop, namespace: str, name: str, attempt: int = 1) -> int | None:
    runtime = loop.run_status(namespace, name).get("runtime") or {}
    return int(runtime["step"]) if runtime.get("attempt") == attempt else None


def live_workers(loop: Loop, namespace: str) -> list[dict[str, Any]]:
    found = chaos.pods(loop.plane, namespace, "ray.io/node-type=worker")
    return [p for p in found if not p["metadata"].get("deletionTimestamp") and p["status"].get("phase") == "Running"]


def start(loop: Loop, namespace: str, name: str, *, trainers: int = 0, **spec: Any) -> dict[str, Any]:
    run = loop.cluster_run(name, claim=f"{name}-checkpoints", trainers=trainers, **RUN_TRAINER)
    run["spec"]["checkpoint"]["savePeriod"] = SAVE_PERIOD
    run["spec"]["restartPolicy"].update(spec.pop("restartPolicy", {}))
    loop.plane.apply(loop.checkpoints_pvc(f"{name}-checkpoints"), run, namespace=namespace)
    pods = 2 + trainers
    loop.wait(lambda: len(live_workers(loop, namespace)) == pods, timeout=300, what=f"the {pods} worker pods Running")
    return run


def assert_finished_like_undisturbed(loop: Loop, namespace: str, name: str, undisturbed: str) -> dict[str, Any]:
    status = loop.wait_phase(namespace, name, "Succeeded", timeout=1200)
    claim = loop.bed.runner.claim_directory(namespace, f"{name}-checkpoints")
    recorded = PurePosixPath(status["checkpoints"]["latest"]["path"])
    assert recorded.parent == PurePosixPath("/checkpoints") / namespace / name, recorded  # <path>/<namespace>/<run>
    assert recorded.name == layout.step_dirname(STEPS), recorded
    last = verification.open_verified(claim / recorded.relative_to("/checkpoints"))
    assert last.manifest.weights_sha256 == undisturbed
    weights.assert_moved(weights.recorded(status))
    index_file = torch.load(last.replay_metadata, weights_only=True)
    book = ledger.Ledger()
    book.load_state_dict(index_file["restart"]["ledger"])
    assert book.in_state(ledger.State.CONSUMED) == list(range(STEPS * PROMPTS))
    book.check_served(index_file["restart"]["loader"]["next_uid"])
    return status


def test_three_worker_evictions_keep_attempt_1_and_the_weights_of_an_undisturbed_run(
    loop: Loop, namespace: str, undisturbed: str, request: pytest.FixtureRequest
) -> None:
    start(loop, namespace, "spot")
    rng = random.Random(seeds.chosen(request.node, default=SEED))
    moments = sorted([*rng.sample(range(2, STEPS - 8), 2), SAVE_PERIOD * rng.randint(2, STEPS // SAVE_PERIOD - 2)])
    evicted = []
    for at in moments:
        loop.wait(lambda at=at: (runtime_step(loop, namespace, "spot") or 0) >= at, timeout=600, what=f"step {at}")
        victim = rng.choice(loop.wait(lambda: live_workers(loop, namespace), timeout=300, what="a live worker"))
        uid = victim["metadata"]["uid"]
        chaos.evict(loop.plane, namespace, victim["metadata"]["name"])
        evicted.append(victim["metadata"]["name"])
        # A killed worker pod's Ray processes die with it, as a real container's would.
        loop.wait(lambda uid=uid: not localpod.pod_processes(uid), timeout=120, what=f"no process of {evicted[-1]}")

    status = assert_finished_like_undisturbed(loop, namespace, "spot", undisturbed)
    assert status["attempt"]["number"] == 1, status.get("attempts")
    assert [a["number"] for a in status.get("attempts") or []] in ([], [1])  # only the attempt that succeeded
    assert status["attempt"]["workersLost"] == 3, status["attempt"]
    assert (status.get("restarts") or {}).get("total", 0) == 0


def test_a_worker_node_that_stops_heartbeating_and_is_replaced_costs_no_attempt(
    loop: Loop, namespace: str, undisturbed: str
) -> None:
    start(loop, namespace, "lapse")
    loop.wait(lambda: (runtime_step(loop, namespace, "lapse") or 0) >= 8, timeout=600, what="step 8")
    bed = loop.bed
    assert bed.worker_kubelet is not None
    chaos.fail_node(loop.plane, bed.runner, bed.worker_node, bed.worker_kubelet)
    bed.replace_worker_node()  # the cloud replaces the machine: a new node in the same pool registers

    status = assert_finished_like_undisturbed(loop, namespace, "lapse", undisturbed)
    assert status["attempt"]["number"] == 1, (status.get("attempts"), loop.diagnostics())
    assert status["attempt"]["workersLost"] >= 1


def test_a_head_node_that_stops_heartbeating_for_less_than_the_grace_keeps_the_attempt(
    loop: Loop, namespace: str, undisturbed: str
) -> None:
    start(loop, namespace, "blip", restartPolicy={"nodeNotReadySeconds": 90})
    loop.wait(lambda: (runtime_step(loop, namespace, "blip") or 0) >= 6, timeout=600, what="step 6")
    bed = loop.bed
    assert bed.kubelet is not None
    chaos.lapse_node(loop.plane, bed.node, bed.kubelet)  # its kubelet stops posting status; Ray keeps running
    before = runtime_step(loop, namespace, "blip") or 0
    loop.wait(lambda: (runtime_step(loop, namespace, "blip") or 0) >= before + 3, timeout=120,
              what="progress while the head's node is NotReady")  # fmt: skip
    assert loop.run_status(namespace, "blip")["attempt"]["number"] == 1
    assert not loop.run_status(namespace, "blip")["attempt"].get("end")
    bed.kubelet = bed.start_kubelet(bed.node)
    loop.plane.wait_nodes_ready([bed.node])

    status = assert_finished_like_undisturbed(loop, namespace, "blip", undisturbed)
    assert status["attempt"]["number"] == 1


def test_an_evicted_trainer_pod_ends_the_attempt_as_preempted_and_the_next_resumes_from_the_newest_recorded_step(
    loop: Loop, namespace: str, uninterrupted: References, request: pytest.FixtureRequest
) -> None:
    trainer = examples.tiny_run("ref", generationWorkers=2, trainerWorkers=2, **RUN_TRAINER)["spec"]["trainer"]
    undisturbed = uninterrupted({"trainer": trainer}, steps=journeys.REFERENCE_STEPS).at(STEPS)
    start(loop, namespace, "ranks", trainers=2)
    rng = random.Random(seeds.chosen(request.node, default=SEED))
    at = rng.randint(SAVE_PERIOD + 1, 3 * SAVE_PERIOD)
    loop.wait(lambda: (runtime_step(loop, namespace, "ranks") or 0) >= at, timeout=600, what=f"step {at}")
    ranks = chaos.pods(loop.plane, namespace, "ray.io/group=trainer")
    assert len(ranks) == 2, [p["metadata"]["name"] for p in ranks]
    victim = rng.choice(ranks)["metadata"]
    recorded = journeys.latest_step(loop.run_status(namespace, "ranks"))
    chaos.evict(loop.plane, namespace, victim["name"], grace_seconds=0)  # a spot VM reclaimed without notice
    loop.wait(lambda: not localpod.pod_processes(victim["uid"]), timeout=120, what=f"no process of {victim['name']}")

    status = assert_finished_like_undisturbed(loop, namespace, "ranks", undisturbed)
    ended = status["attempts"][0]
    assert ended["number"] == 1 and ended["reason"] == "Preempted", status["attempts"]
    assert "TrainerLost" in ended.get("message", ""), ended
    assert status["restarts"]["preempted"] == 1 and status["restarts"].get("applicationFailure", 0) == 0, status[
        "restarts"
    ]
    second = status["attempt"]
    assert second["number"] == 2, status["attempts"]
    newest_of_1 = max(c["step"] for c in status["checkpoints"]["history"] if c["attempt"] == 1)
    assert recorded is not None and newest_of_1 >= recorded
    assert second["resumedFrom"] == newest_of_1, (second, status["checkpoints"])
