"""The user's journey on the full loop, whichever operator drives it and however the Ray pods run: `kubectl apply`
the tiny example, the operator creates a RayJob, the real KubeRay runs it on Ray pods the pod runner plays, the
real driver checkpoints and reports, the head pod is evicted, attempt 2 resumes from the recorded step, and the run
succeeds.

Used by tests/e2e/test_chart_operator.py (the chart installed by helm, the operator in its container, Ray pods as
processes). Exact resume across two preemptions of the head, one in the middle of a save
(`preemptions_end_with_the_weights_of_an_uninterrupted_run`) runs in tests/e2e/test_ray_containers.py (our operator
as its own process, Ray pods as containers): between the two, every part the journey crosses runs as it would on a
cluster.
"""

from __future__ import annotations

import json
import random
import re
import time
from typing import TYPE_CHECKING, Any

import chaos
from support import weights
from support.fullloop_runs import head_name, manifests, recorded_by, run_directory

if TYPE_CHECKING:
    from conftest import Loop  # tests/e2e/conftest.py
    from support.uninterrupted import References

REFERENCE_STEPS = 40
"""How long the full loop's uninterrupted reference trains: the longest run the tests of the second group compare
with it, so that one local driver serves them all (`support.uninterrupted`)."""

STEP_LOG = re.compile(r"step (\d+): reward")


def latest_step(status: dict[str, Any]) -> int | None:
    latest = (status.get("checkpoints") or {}).get("latest")
    return int(latest["step"]) if latest else None


def printer_columns(loop: Loop, namespace: str, name: str, *, wide: bool = False) -> dict[str, str]:
    """`kubectl get trun NAME` (`-o wide`: with the wide columns) as {header: cell}, cut where the headers start."""
    table = loop.plane.kubectl("get", "trun", name, "-n", namespace, *(["-o", "wide"] if wide else [])).stdout
    header, row = table.splitlines()[:2]
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    return {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)}


def logged_progress(loop: Loop, namespace: str, pod: str) -> int | None:
    """The last `step N: reward ...` line the driver of `pod` logged (the controller logs every logEvery steps)."""
    keeper = loop.bed.runner.containers
    local = loop.bed.runner.find(namespace, pod) or (keeper.find(namespace, pod) if keeper else None)
    text = "".join(local.job_driver_logs().values()) if local else ""
    steps = [int(m.group(1)) for m in STEP_LOG.finditer(text)]
    return max(steps) if steps else None


JOURNEY_STEPS = 40  # the example's 120 shortened: an eviction after the first save and a resume need four periods


def evicted_head_is_survived(loop: Loop, namespace: str, *, image: str | None = None) -> dict[str, Any]:
    """The journey with its assertions: the tiny example (run `tiny`, its Ray pods from `image` if given, its steps
    JOURNEY_STEPS), its head evicted 3 steps past the first recorded checkpoint, attempt 2 resuming from the recorded
    step, Succeeded. Prints and returns its figures."""
    started = time.monotonic()
    run = loop.tiny_run("tiny", steps=JOURNEY_STEPS)
    if image is not None:
        run["spec"]["image"] = image
    steps, save_period = run["spec"]["trainer"]["steps"], run["spec"]["checkpoint"]["savePeriod"]
    loop.plane.apply(loop.checkpoints_pvc("tiny-checkpoints"), run, namespace=namespace)

    first = loop.wait(
        lambda: latest_step(loop.status_unless_failed(namespace, "tiny")),
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
    goodput = final["goodput"]  # the eviction cost a restart; nothing stalled
    lost = goodput["lostSeconds"]
    assert lost["start"] > 0 and lost["restart"] > 0 and lost["stall"] == 0 and 0 < goodput["ratio"] < 1, goodput
    wide = printer_columns(loop, namespace, "tiny", wide=True)
    assert float(wide["GOODPUT"]) == loop.run_status(namespace, "tiny")["goodput"]["ratio"], (wide, goodput)

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


def preemptions_end_with_the_weights_of_an_uninterrupted_run(
    loop: Loop, namespace: str, uninterrupted: References, *, seed: int, image: str | None = None
) -> None:
    """Exact resume on the full loop: run `rp` (its Ray pods from `image` if given) preempted twice: at a random
    moment after attempt 1's first recorded checkpoint, then in the middle of a save (attempt 2's driver frozen by a
    crash point after writing a manifest, then evicted without a grace period). It resumes each time from a recorded
    checkpoint, never from the interrupted save, and ends with the weights of the configuration its RayJob gave the
    driver, run uninterrupted on a local Ray (the session's reference, `uninterrupted`). Its random moments come
    from `seed` (the `chaos_seed` fixture: a failure report prints it, E2E_CHAOS_SEED replays it)."""
    rng = random.Random(seed)
    steps, save_period = 40, 5
    run = loop.tiny_run("rp", claim="rp-checkpoints", steps=steps, checkpoint={"savePeriod": save_period})
    if image is not None:
        run["spec"]["image"] = image
    loop.plane.apply(loop.checkpoints_pvc("rp-checkpoints"), run, namespace=namespace)
    rayjob = loop.wait(
        lambda: loop.plane.get(f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs/rp-a1"),
        timeout=60,
        what="attempt 1's RayJob",
    )
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
    pending = json.loads((directory / f"tmp_step_{saving_step}.attempt_2" / "manifest.json").read_text())
    assert pending["attempt"] == 2 and pending["step"] == saving_step
    # Written, not renamed: an incomplete checkpoint. A step_N of the same step may exist already, from
    # attempt 1 (saved after its last recorded checkpoint, before the eviction landed); this save would replace
    # it (the re-save path moves it to old_step_N first), but it is not attempt 2's.
    assert manifests(directory).get(saving_step, {}).get("attempt") != 2, manifests(directory)[saving_step]
    chaos.evict(loop.plane, namespace, head, grace_seconds=0)
    moments.append(f"attempt 2: in the save of step {saving_step} (manifest written, not renamed)")

    final = loop.wait_phase(namespace, "rp", "Succeeded", timeout=600)
    print("evictions:", "; ".join(moments))

    ended = final["attempts"]
    assert [a["reason"] for a in ended[:2]] == ["Preempted"] * 2, ended
    assert final["restarts"]["preempted"] == 2 and final["attempt"]["number"] == 3
    print("steps lost per preemption:", [a.get("stepsLost") for a in ended[:2]], f"(save period {save_period})")
    for earlier, later in zip(ended[:2], [ended[1], final["attempt"]], strict=True):
        assert later["resumedFrom"] is not None and later["resumedFrom"] >= (earlier.get("resumedFrom") or 0)
    # The interrupted save was never used.
    assert final["attempt"]["resumedFrom"] < saving_step, (saving_step, ended, final["attempt"])
    latest = final["checkpoints"]["latest"]
    assert latest["step"] == steps
    reference = uninterrupted.of_rayjob(rayjob, steps=REFERENCE_STEPS).at(steps)
    assert latest["weightsSha256"] == reference, (latest, reference)
    weights.assert_moved(weights.recorded(final))
