"""Chaos on the full loop (real KubeRay, real driver, our operator as its own process): repeated preemption at random
moments (one of them during a save) ends with the same weights as an uninterrupted run; a zombie attempt cannot
record a checkpoint; our operator killed mid-attempt creates no duplicate RayJob and the run finishes.

The runs are the tiny example, shortened (fewer steps, a shorter save period) to keep the suite's time modest.
Set E2E_CHAOS_SEED to replay the random moments of a failed run (the seed is printed).
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import chaos
from support.fullloop_runs import (
    head_name,
    history,
    manifests,
    owner_attempt,
    recorded_by,
    reference_run,
    run_directory,
)
from trainingrun_runtime import timestamps

if TYPE_CHECKING:
    from conftest import Loop  # tests/e2e/conftest.py

pytestmark = pytest.mark.e2e


def test_three_preemptions_one_during_a_save_end_with_the_weights_of_an_uninterrupted_run(
    loop: Loop, namespace: str, tmp_path: Path
) -> None:
    seed = int(os.environ.get("E2E_CHAOS_SEED") or time.time_ns() % 2**31)
    rng = random.Random(seed)
    print(f"\nE2E_CHAOS_SEED={seed}")
    steps, save_period = 40, 5
    loop.plane.apply(
        loop.checkpoints_pvc("rp-checkpoints"),
        loop.tiny_run("rp", claim="rp-checkpoints", steps=steps, checkpoint={"savePeriod": save_period}),
        namespace=namespace,
    )
    rayjob = loop.wait(
        lambda: loop.plane.get(f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs/rp-a1"),
        timeout=60,
        what="attempt 1's RayJob",
    )
    reference = reference_run(loop, rayjob, tmp_path)
    try:
        moments: list[str] = []
        # 1: a random moment after attempt 1 recorded its first checkpoint.
        loop.wait(lambda: recorded_by(loop, namespace, "rp", 1), timeout=420, what="attempt 1's first checkpoint")
        head = head_name(loop, namespace, "rp", 1)
        # Attempt 2's driver will freeze in its first save, after writing the manifest and before the rename
        # (the runtime's crash points), so that the next eviction lands in the middle of a save for certain.
        loop.bed.runner.add_env(
            {"trainingrun.dev/run": "rp", "trainingrun.dev/attempt": "2"},
            {"TRAININGRUN_CRASH_AT": ",".join(f"manifest_written@{n}" for n in range(save_period, steps, save_period))},
        )
        delay = rng.uniform(0, 3)
        time.sleep(delay)
        chaos.evict(loop.plane, namespace, head)
        moments.append(f"attempt 1: {delay:.1f}s after its first checkpoint was recorded")

        # 2: during a save of attempt 2, without a grace period.
        directory = run_directory(loop, namespace, "rp-checkpoints", "rp")
        markers = directory / "crash-markers"
        head = head_name(loop, namespace, "rp", 2)
        frozen = loop.wait(
            lambda: next(iter(markers.glob("crashed-at-manifest_written@*")), None),
            timeout=420,
            what="attempt 2's driver in the middle of a save",
        )
        saving_step = int(frozen.name.rsplit("@", 1)[1])
        pending = json.loads((directory / f"tmp_step_{saving_step}" / "manifest.json").read_text())
        assert pending["attempt"] == 2 and pending["step"] == saving_step
        # Written, not renamed: an incomplete checkpoint. A step_N of the same step may exist already, from
        # attempt 1 (saved after its last recorded checkpoint, before the eviction landed); this save would replace
        # it (the re-save path moves it to old_step_N first), but it is not attempt 2's.
        assert manifests(directory).get(saving_step, {}).get("attempt") != 2, manifests(directory)[saving_step]
        chaos.evict(loop.plane, namespace, head, grace_seconds=0)
        moments.append(f"attempt 2: in the save of step {saving_step} (manifest written, not renamed)")

        # 3: a random moment after attempt 3 recorded its first checkpoint.
        loop.wait(lambda: recorded_by(loop, namespace, "rp", 3), timeout=420, what="attempt 3's first checkpoint")
        head = head_name(loop, namespace, "rp", 3)
        delay = rng.uniform(0, 3)
        time.sleep(delay)
        chaos.evict(loop.plane, namespace, head)
        moments.append(f"attempt 3: {delay:.1f}s after its first checkpoint was recorded")

        final = loop.wait_phase(namespace, "rp", "Succeeded", timeout=600)
        print("evictions:", "; ".join(moments))
        assert reference.wait(timeout=600) == 0, (tmp_path / "reference.log").read_text()[-3000:]
    finally:
        if reference.poll() is None:
            chaos.kill_process(reference)

    ended = final["attempts"]
    assert [a["reason"] for a in ended[:3]] == ["Preempted"] * 3, ended
    assert final["restarts"]["preempted"] == 3 and final["attempt"]["number"] == 4
    print("steps lost per preemption:", [a.get("stepsLost") for a in ended[:3]], f"(save period {save_period})")
    for earlier, later in zip(ended[:3], [*ended[1:3], final["attempt"]], strict=True):
        assert later["resumedFrom"] is not None and later["resumedFrom"] >= (earlier.get("resumedFrom") or 0)
    assert ended[2]["resumedFrom"] < saving_step, (saving_step, ended)  # the interrupted save was never used
    latest = final["checkpoints"]["latest"]
    assert latest["step"] == steps
    uninterrupted = json.loads((tmp_path / "rp" / f"step_{steps}" / "manifest.json").read_text())
    assert latest["weightsSha256"] == uninterrupted["weights_sha256"], (latest, uninterrupted["weights_sha256"])


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
