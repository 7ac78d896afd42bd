"""The user's journey on the full loop, whichever operator drives it: `kubectl apply` the tiny example, the
operator creates a RayJob, the real KubeRay runs it on Ray pods the pod runner plays, the real driver checkpoints
and reports, the head pod is evicted, attempt 2 resumes from the recorded step, and the run succeeds.

Used by tests/e2e/test_full_loop_journey.py (our operator as its own process) and
tests/e2e/test_chart_operator.py (the chart installed by helm, the operator in its container).
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

import chaos

if TYPE_CHECKING:
    from conftest import Loop  # tests/e2e/conftest.py

STEP_LOG = re.compile(r"step (\d+): reward")


def latest_step(status: dict[str, Any]) -> int | None:
    latest = (status.get("checkpoints") or {}).get("latest")
    return int(latest["step"]) if latest else None


def printer_columns(loop: Loop, namespace: str, name: str) -> dict[str, str]:
    table = loop.plane.kubectl("get", "trun", name, "-n", namespace).stdout.splitlines()
    return dict(zip(table[0].split(), table[1].split(), strict=True))


def logged_progress(loop: Loop, namespace: str, pod: str) -> int | None:
    """The last `step N: reward ...` line the driver of `pod` logged (the controller logs every logEvery steps)."""
    keeper = loop.bed.runner.containers
    local = loop.bed.runner.find(namespace, pod) or (keeper.find(namespace, pod) if keeper else None)
    text = "".join(local.job_driver_logs().values()) if local else ""
    steps = [int(m.group(1)) for m in STEP_LOG.finditer(text)]
    return max(steps) if steps else None


def evicted_head_is_survived(loop: Loop, namespace: str, *, image: str | None = None) -> dict[str, Any]:
    """The journey with its assertions: the tiny example (run `tiny`, its Ray pods from `image` if given), its head
    evicted 3 steps past the first recorded checkpoint, attempt 2 resuming from the recorded step, Succeeded.
    Prints and returns its figures."""
    started = time.monotonic()
    run = loop.tiny_run("tiny")
    if image is not None:
        run["spec"]["image"] = image
    steps, save_period = run["spec"]["trainer"]["steps"], run["spec"]["checkpoint"]["savePeriod"]
    loop.plane.apply(loop.checkpoints_pvc("tiny-checkpoints"), run, namespace=namespace)

    first = loop.wait(
        lambda: latest_step(loop.run_status(namespace, "tiny")),
        timeout=420,
        what="the first checkpoint recorded in status",
    )
    first_at = time.monotonic() - started
    # The driver reports progress between checkpoints (status.runtime.step): evict once it is 3 steps past the
    # recorded checkpoint. Steps lost: at least those 3, unless the driver saves on the notice (then 0).
    reached = loop.wait(
        lambda: (
            (r := loop.run_status(namespace, "tiny").get("runtime") or {}).get("attempt") == 1
            and r.get("step", 0) >= first + 3
            and r["step"]
        ),
        timeout=120,
        what="a progress report 3 steps past the first checkpoint",
    )
    head = chaos.head_pod(loop.plane, namespace, "trainingrun.dev/run=tiny,trainingrun.dev/attempt=1")
    chaos.evict(loop.plane, namespace, head["metadata"]["name"])
    evicted = time.monotonic()

    rayjob_2 = loop.wait(
        lambda: loop.plane.get(f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs/tiny-a2"),
        timeout=180,
        what="attempt 2's RayJob",
    )
    to_attempt_2 = time.monotonic() - evicted
    loop.wait(
        lambda: any(
            c["attempt"] == 2
            for c in (loop.run_status(namespace, "tiny").get("checkpoints") or {}).get("history") or []
        ),
        timeout=420,
        what="attempt 2's first checkpoint",
    )
    to_resumed_checkpoint = time.monotonic() - evicted

    final = loop.wait_phase(namespace, "tiny", "Succeeded", timeout=600)
    journey = time.monotonic() - started
    ended = final["attempts"][0]
    recorded_by_1 = max(c["step"] for c in final["checkpoints"]["history"] if c["attempt"] == 1)
    progress = logged_progress(loop, namespace, head["metadata"]["name"])
    figures = {
        "journey_wall_s": round(journey, 1),
        "apply_to_first_checkpoint_s": round(first_at, 1),
        "eviction_to_attempt2_rayjob_s": round(to_attempt_2, 2),
        "eviction_to_attempt2_first_checkpoint_s": round(to_resumed_checkpoint, 1),
        "save_period": save_period,
        "status_steps_lost": ended.get("stepsLost"),
        "resumed_from": recorded_by_1,
        "reported_step_at_eviction": reached,
        "driver_logged_step_before_eviction": progress,
        "steps_lost_by_driver_log": None if progress is None else max(0, progress - recorded_by_1),
    }
    print("\nFIGURES " + " ".join(f"{k}={v}" for k, v in figures.items()))

    waited = loop.plane.kubectl(
        "wait", "--for=condition=Succeeded", "trun/tiny", "-n", namespace, "--timeout=30s", check=False
    )
    assert waited.returncode == 0, waited.stderr

    columns = printer_columns(loop, namespace, "tiny")
    assert columns["PHASE"] == "Succeeded"
    assert columns["STEP"] == str(steps) and columns["ATTEMPT"] == "2" and columns["RESTARTS"] == "1", columns
    assert columns["PROGRESS"] == f"{steps}/{steps}", columns

    assert ended["number"] == 1 and ended["reason"] == "Preempted", final["attempts"]
    # Lost: from the recorded checkpoint to the newest step the driver reported before it was killed.
    assert isinstance(ended.get("stepsLost"), int) and reached - recorded_by_1 <= ended["stepsLost"], ended
    assert ended["stepsLost"] < 2 * save_period, ended
    assert recorded_by_1 >= first
    second = final["attempt"] if final["attempt"]["number"] == 2 else final["attempts"][1]
    assert second["resumedFrom"] == recorded_by_1, (second, final["checkpoints"])
    assert f"--resume {recorded_by_1}" in rayjob_2["spec"]["entrypoint"]
    # The driver really resumed: attempt 2's first checkpoint is the first multiple of the save period after the
    # step it resumed from (a fresh start would have saved the first period's step again). That step is attempt 1's
    # last periodic save, or the one its driver made on the eviction's notice (the head's preStop hook).
    by_2 = sorted(c["step"] for c in final["checkpoints"]["history"] if c["attempt"] == 2)
    assert by_2 and by_2[0] == (recorded_by_1 // save_period + 1) * save_period, final["checkpoints"]["history"]
    assert final["checkpoints"]["latest"]["step"] == steps and final["checkpoints"]["latest"]["attempt"] == 2
    return figures
