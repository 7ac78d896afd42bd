"""Chaos on the full loop (real KubeRay, real driver, our operator as its own process): a zombie attempt cannot
record a checkpoint; our operator killed mid-attempt creates no duplicate RayJob and the run finishes. (Repeated
preemption at random moments ending with the weights of an uninterrupted run is in test_ray_containers.py, on Ray
pods as containers: support/journeys.py.)

The runs are the tiny example, shortened (fewer steps, a shorter save period) to keep the suite's time modest.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

import chaos
from support.fullloop_runs import (
    head_name,
    history,
    manifests,
    owner_attempt,
    recorded_by,
    run_directory,
)
from trainingrun_runtime import timestamps

if TYPE_CHECKING:
    from conftest import Loop  # tests/e2e/conftest.py

pytestmark = pytest.mark.e2e


def test_a_zombie_attempt_cannot_record_a_checkpoint_once_attempt_2_has_started(loop: Loop, namespace: str) -> None:
    steps, save_period = 30, 5
    # Retention off in effect (keepLast 50): until attempt 2's driver claims the directory, a live zombie's
    # retention can delete the step attempt 2 is pinned to resume from (seen: attempt 2 FailedRestore, run Failed).
    loop.plane.apply(
        loop.checkpoints_pvc("zb-checkpoints"),
        loop.tiny_run(
            "zb",
            claim="zb-checkpoints",
            steps=steps,
            checkpoint={"savePeriod": save_period, "retention": {"keepLast": 50}},
        ),
        namespace=namespace,
    )
    loop.wait(lambda: recorded_by(loop, namespace, "zb", 1), timeout=420, what="attempt 1's first checkpoint")
    directory = run_directory(loop, namespace, "zb-checkpoints", "zb")
    # The node is cut off and paused: the head pod is force-deleted, its processes (Ray, the driver) stay, frozen.
    zombie = chaos.partition(loop.plane, loop.bed.runner, namespace, head_name(loop, namespace, "zb", 1), freeze=True)
    try:
        started_2 = loop.wait(
            lambda: (s := loop.run_status(namespace, "zb")).get("attempt", {}).get("number") == 2 and s,
            timeout=180,
            what="attempt 2 started",
        )
        # From here on, nothing attempt 1 does may be recorded. The zombie wakes up and saves on.
        recorded_before = {(c["step"], c["attempt"]) for c in history(started_2)}
        on_disk_before = set(manifests(directory))
        chaos.thaw(zombie)
        zombie_step = loop.wait(
            lambda: min(
                (s for s, m in manifests(directory).items() if m["attempt"] == 1 and s not in on_disk_before),
                default=None,
            ),
            timeout=180,
            what="the zombie to write a checkpoint after attempt 2 started",
        )
        # A stale report with a valid token for the driver's identity, as a zombie whose token still works sends
        # it (the API server caches a token's authentication for 10 s, so even a pod-bound token outlives its pod).
        account = started_2["identity"]["serviceAccountName"]
        kubeconfig = loop.plane.service_account_kubeconfig(namespace, account)
        stale = {
            "status": {
                "runtime": {
                    "attempt": 1,
                    "step": 999,
                    "updated": timestamps.now(),
                    "finished": False,
                    "lastCheckpoint": {
                        "step": 999,
                        "path": "/checkpoints/zb/step_999",
                        "attempt": 1,
                        "time": timestamps.now(),
                    },
                }
            }
        }
        patched = loop.plane.kubectl(
            "patch",
            "trun",
            "zb",
            "-n",
            namespace,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps(stale),
            kubeconfig=kubeconfig,
            check=False,
        )
        assert patched.returncode == 0, patched.stderr  # RBAC lets the identity write; fencing must drop it
        # The volume's fence: attempt 2's driver claims the run directory (owner.json) before it restores; from
        # then on the zombie, still alive, writes no checkpoint (a save whose check passed just before the claim
        # may still finish: at most one).
        loop.wait(lambda: owner_attempt(directory) == 2, timeout=300, what="attempt 2's driver to claim the directory")
        by_zombie = {s for s, m in manifests(directory).items() if m["attempt"] == 1}
        loop.wait(lambda: recorded_by(loop, namespace, "zb", 2), timeout=420, what="attempt 2's first checkpoint")
        status = loop.run_status(namespace, "zb")
        late = [c for c in history(status) if c["attempt"] == 1 and (c["step"], 1) not in recorded_before]
        assert not late, (
            f"zombie wrote step {zombie_step}; recorded after attempt 2 started: {late}\n{loop.diagnostics()}"
        )
        assert status["checkpoints"]["latest"]["attempt"] == 2
        after_claim = {s for s, m in manifests(directory).items() if m["attempt"] == 1} - by_zombie
        assert len(after_claim) <= 1, (sorted(by_zombie), sorted(after_claim))
    finally:
        chaos.end_zombie(zombie)
    final = loop.wait_phase(namespace, "zb", "Succeeded", timeout=600)
    assert final["checkpoints"]["latest"]["step"] == steps and final["attempt"]["number"] == 2
    assert not [c for c in history(final) if c["attempt"] == 1 and (c["step"], 1) not in recorded_before]


def test_our_operator_killed_during_an_attempt_leaves_no_duplicate_rayjob_and_the_run_finishes(
    loop: Loop, namespace: str
) -> None:
    assert loop.operator is not None
    steps, save_period = 30, 5
    loop.plane.apply(
        loop.checkpoints_pvc("ok-checkpoints"),
        loop.tiny_run("ok", claim="ok-checkpoints", steps=steps, checkpoint={"savePeriod": save_period}),
        namespace=namespace,
    )
    seen: set[str] = set()

    def rayjob_names() -> set[str]:
        names = {j["metadata"]["name"] for j in loop.rayjobs(namespace)}
        seen.update(names)
        return names

    loop.wait(
        lambda: recorded_by(loop, namespace, "ok", 1) and rayjob_names(),
        timeout=420,
        what="attempt 1 running and checkpointing",
    )
    loop.operator.kill()
    killed_at = max(recorded_by(loop, namespace, "ok", 1))
    # With the operator down, the driver goes on and reports into status.runtime itself.
    loop.wait(
        lambda: (
            rayjob_names() is not None
            and ((loop.run_status(namespace, "ok").get("runtime") or {}).get("step") or 0) > killed_at
        ),
        timeout=300,
        what="a checkpoint reported while the operator is down",
    )
    loop.operator.start()
    final = loop.wait_phase(namespace, "ok", "Succeeded", timeout=600)
    rayjob_names()
    assert seen == {"ok-a1"}, seen
    assert final["attempt"]["number"] == 1 and (final.get("restarts") or {}).get("total", 0) == 0
    recorded = [c["step"] for c in history(final) if c["attempt"] == 1]
    assert recorded == sorted(recorded) and recorded[-1] == steps
    assert [s for s in recorded if s > killed_at], recorded  # reports made while it was down were not lost
