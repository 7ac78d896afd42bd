"""A corrupt checkpoint on the full loop (real KubeRay, real driver, our operator as its own process): the step the
operator pins for the next attempt fails verification, and the attempt falls back to the previous recorded step by
itself. No attempt ends FailedRestore and no budget is charged; the bad step is listed in status.checkpoints.bad
(until the attempt saves that step anew) with an event naming the file and the mismatch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

import chaos
from support import bundles
from support.fullloop_runs import head_name, history, recorded_by, run_directory

if TYPE_CHECKING:
    from conftest import Loop  # tests/e2e/conftest.py

pytestmark = pytest.mark.e2e


def test_a_pinned_checkpoint_that_fails_verification_is_passed_over_in_the_same_attempt(
    loop: Loop, namespace: str
) -> None:
    save_period = 5
    # Attempt 1 holds 30 s after training step 12, past its second save: the run cannot end before the eviction.
    loop.bed.runner.add_env(
        {"trainingrun.dev/run": "cc", "trainingrun.dev/attempt": "1"}, {"TRAININGRUN_CRASH_AT": "trained@12~30"}
    )
    loop.plane.apply(
        loop.checkpoints_pvc("cc-checkpoints"),
        loop.tiny_run(
            "cc",
            claim="cc-checkpoints",
            steps=20,
            checkpoint={"savePeriod": save_period, "retention": {"keepLast": 5}},
        ),
        namespace=namespace,
    )
    directory = run_directory(loop, namespace, "cc-checkpoints", "cc")
    loop.wait(
        lambda: (directory / "crash-markers" / "held-at-trained@12").exists(),
        timeout=420,
        what="attempt 1 held after step 12",
    )
    loop.wait(lambda: len(recorded_by(loop, namespace, "cc", 1)) >= 2, timeout=60, what="attempt 1's second checkpoint")
    # Without notice (grace 0): the driver saves nothing more, and the newest recorded step is what attempt 2 gets.
    chaos.evict(loop.plane, namespace, head_name(loop, namespace, "cc", 1), grace_seconds=0)
    ended = loop.wait(
        lambda: (s := loop.run_status(namespace, "cc")).get("attempts") and s, timeout=120, what="attempt 1 ended"
    )
    pinned = ended["checkpoints"]["latest"]["step"]
    weights = next(p for p in sorted((directory / f"step_{pinned}" / "policy").rglob("*")) if p.is_file())
    bundles.flip_middle_byte(weights)

    # Until attempt 2 saves that step again (its first save, one period on), the step is listed as bad.
    status = loop.wait(
        lambda: (s := loop.run_status(namespace, "cc")).get("checkpoints", {}).get("bad") and s,
        timeout=420,
        what="the pinned step listed as bad",
    )
    assert status["attempt"]["number"] == 2, status["attempts"]
    assert status["checkpoints"]["bad"] == [pinned]
    older = max(c["step"] for c in history(status) if c["attempt"] == 1 and c["step"] < pinned)
    assert status["attempt"]["resumedFrom"] == older, status["attempt"]
    assert status["restarts"]["failedRestore"] == 0 and status["restarts"]["total"] == 1, status["restarts"]
    rayjob = loop.plane.get(f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs/cc-a2") or {}
    entrypoint = rayjob.get("spec", {}).get("entrypoint", "")
    assert f"--resume {pinned}" in entrypoint and f"--fallback {older}" in entrypoint, entrypoint
    corrupt = [e["message"] for e in loop.wait_events(namespace, "CheckpointCorrupt")]
    assert len(corrupt) == 1 and f"step {pinned}" in corrupt[0] and weights.name in corrupt[0], corrupt
    final = loop.wait_phase(namespace, "cc", "Succeeded", timeout=600)
    assert final["attempt"]["number"] == 2 and final["checkpoints"]["latest"]["step"] == 20
