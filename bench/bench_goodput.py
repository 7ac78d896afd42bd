"""Benchmark: goodput under disruption on the full loop, and where the seconds of each disruption go.

    calm:   the cluster-shaped example (head + a worker group of 2 on its own node) runs STEPS steps undisturbed
    storm:  the same run under a seeded schedule of disruptions, each when the run reaches its step:
              worker eviction, head eviction (Eviction API), worker eviction, SIGKILL of the driver, worker-node
              failure (the machine gone; the cloud registers a new node of the same name and shape)
    goodput_under_disruption = calm wall time / storm wall time           (goal >= 0.8 on this machine)
    goodput_operator_vs_measured_abs_diff = |the storm's status.goodput.ratio - its goodput measured here|
        (goal <= 0.03), measured from the drivers' own event logs on the PVC: the seconds between each step the run
        kept and the step before it in the same attempt (an attempt's first kept step at its attempt's median step
        time), less the seconds a save held the train pump between them, over the run's time from its first
        attempt's start to its last step
    steps_lost_per_unannounced_kill = the steps the driver's SIGKILL lost (no notice: the steps its attempt finished
        past the one the next attempt resumed from, from the event logs), struck at a random moment of a save
        period, at the example's savePeriod                               (goal < savePeriod)

Both are timed from `kubectl apply` to phase Succeeded, on the same bed (control plane, real KubeRay, our operator
as the chart runs it, the pod runner playing Ray pods), one after the other. Per disruption kind it writes the
steps lost (the attempt history's `stepsLost`, which counts from the newest recorded checkpoint), the new attempts
it caused, and the seconds until training made progress again past the step where it struck. For a head's loss
or a driver kill (they end the attempt) the time to progress is split into stages, from the driver's event log
(ROOT/RUN/attempts/N/events.jsonl, on the PVC) and the API objects:

    struck -> notice answered (the driver saved on the preStop hook's request) -> detected (the attempt ended in
           status) -> next RayJob created -> Ray cluster ready (KubeRay
           submitted the driver: it started) -> restore done (TransferQueue and the policy loaded) -> driver set up
           (the controller actor created) -> first new step

The schedule is harsh for spot capacity on purpose, and still within what a bad day can bring: five disruptions
in a run of about ten minutes here (3000 steps), one every two minutes of training. A busy spot pool reclaims a VM
every few hours, or on its worst days about once an hour; a run on three such VMs meets one disruption every 20 min
at most. Two minutes is ten times that, compressed so that the benchmark takes minutes, with each kind hit once or
twice so the cost of each shows beside the others. Goodput scales with the rate: a run that meets the same
disruptions half as often loses half as much (each kind's cost is written on its own below). For the worker
losses it writes the seconds until every lost generation worker was replaced (its pod back, Ray joined, the
current weights loaded: `generator_replaced` in the event log), the steps per second in the 30 s after the strike
and in the 30 s after the replacement, against the calm run's; for the head loss and the driver kill, which end
the attempt, the stage split of the next attempt's start. Writes its figures under "goodput" in
bench-results.json (merging) and prints them.

    .venv/bin/python bench/bench_goodput.py [--steps 3000] [--seed 7]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "hack" / "testbed"), str(ROOT / "tests")]

import results  # noqa: E402  (bench/results.py: bench-results.json)

import chaos  # noqa: E402  (hack/testbed is not a package)
import controlplane  # noqa: E402
import examples  # noqa: E402
import fullloop  # noqa: E402
import ourop  # noqa: E402
from support import waiting  # noqa: E402
from trainingrun_runtime import timestamps  # noqa: E402
from trainingrun_runtime.driver import events  # noqa: E402
from trainingrun_runtime.sdk import notice  # noqa: E402

NAMESPACE = "bench-goodput"
SAVE_PERIOD = int(examples.tiny_run()["spec"]["checkpoint"]["savePeriod"])
"""The example's own (manifests/examples/tiny.yaml), so that the steps an unannounced kill loses are its."""
RESTARTS = ("head_loss", "driver_kill")
"""The kinds that end the attempt (the next one resumes from a checkpoint): their cost is split into stages."""
WORKER_KINDS = ("worker_loss", "node_failure")
"""The kinds that take generation workers (the worker node's pods) and keep the attempt."""


@dataclass
class Strike:
    """One disruption: what, at which step, when, and what the run was doing then."""

    kind: str
    at_step: int
    t: float = 0.0
    attempt: int = 0
    reached: int = 0
    progress_s: float | None = None
    notice_recorded_s: float | None = None  # a head loss: until its notice's checkpoint was in status
    stages: dict[str, float] = field(default_factory=dict)
    replaced_s: float | None = None  # a worker's loss: until every generation worker it took was replaced
    delay_s: float = 0.0  # a driver kill: how long after the run reached its step (a random moment in a period)
    lost_by_log: int | None = None  # a driver kill: steps its attempt finished past the step the next resumed from


def status(plane: controlplane.ControlPlane, name: str) -> dict[str, Any]:
    run = plane.get(f"/apis/trainingrun.dev/v1alpha1/namespaces/{NAMESPACE}/trainingruns/{name}")
    return dict((run or {}).get("status") or {})


def runtime_step(plane: controlplane.ControlPlane, name: str) -> tuple[int, int]:
    """(attempt, newest finished step) as the driver last reported them (0, 0 before any report)."""
    runtime = status(plane, name).get("runtime") or {}
    return int(runtime.get("attempt") or 0), int(runtime.get("step") or 0)


def live_workers(plane: controlplane.ControlPlane) -> list[dict[str, Any]]:
    found = chaos.pods(plane, NAMESPACE, "ray.io/node-type=worker")
    return [p for p in found if not p["metadata"].get("deletionTimestamp") and p["status"].get("phase") == "Running"]


def run_once(plane: controlplane.ControlPlane, bed: fullloop.FullLoopBed, name: str, steps: int,
             schedule: list[Strike], rng: random.Random) -> float:  # fmt: skip
    """Applies the run, strikes each disruption at its step, returns seconds from apply to Succeeded."""
    run = examples.cluster_run(bed, name, claim=f"{name}-checkpoints", steps=steps, logEvery=5)
    run["spec"]["restartPolicy"]["backoff"] = {"initialSeconds": 1, "maxSeconds": 5, "factor": 2}
    started = time.time()
    plane.apply(examples.checkpoints_pvc(f"{name}-checkpoints"), run, namespace=NAMESPACE)
    pending = list(schedule)
    last: Strike | None = None
    while True:
        current = status(plane, name)
        if current.get("phase") in ("Succeeded", "Failed"):
            break
        for hit in schedule:
            if (
                hit.kind == "head_loss"
                and hit.t
                and hit.notice_recorded_s is None
                and notice_saved(bed, name, current, hit)
            ):
                hit.notice_recorded_s = time.time() - hit.t
        attempt, step = runtime_step(plane, name)
        running = int((current.get("attempt") or {}).get("number") or 0)
        # One at a time, so that each one's cost is its own: the next strike waits until the current attempt (after
        # a head loss, status.runtime holds the old attempt's report until the new one's) has trained past the step
        # where the last one struck, and at least 15 s have passed.
        recovered = last is None or step > last.reached
        if pending and attempt and attempt == running and step >= pending[0].at_step and recovered:
            if last is None or time.time() - last.t >= 15:
                last = pending.pop(0)
                strike(plane, bed, name, last, attempt, step, rng)
        time.sleep(0.5)
    if current.get("phase") != "Succeeded":
        raise SystemExit(f"{name} ended {current.get('phase')}: {current.get('reason')}: {current.get('message')}")
    return time.time() - started


def strike(plane: controlplane.ControlPlane, bed: fullloop.FullLoopBed, name: str, hit: Strike, attempt: int,
           step: int, rng: random.Random) -> None:  # fmt: skip
    time.sleep(hit.delay_s)  # status shows a step when its checkpoint is reported: strike later than that
    hit.t, hit.attempt, hit.reached = time.time(), attempt, step
    print(f"  step {step} of attempt {attempt} (+{hit.delay_s:.1f} s): {hit.kind}", flush=True)
    if hit.kind == "worker_loss":
        victim = rng.choice(waiting.wait(lambda: live_workers(plane), timeout=300, what="a live worker"))
        chaos.evict(plane, NAMESPACE, victim["metadata"]["name"])
    elif hit.kind == "head_loss":
        chaos.evict(plane, NAMESPACE, chaos.head_pod(plane, NAMESPACE)["metadata"]["name"])
    elif hit.kind == "driver_kill":
        head = chaos.head_pod(plane, NAMESPACE)["metadata"]["name"]
        chaos.kill_driver(bed.runner, NAMESPACE, head)
    elif hit.kind == "node_failure":
        assert bed.worker_kubelet is not None
        chaos.fail_node(plane, bed.runner, bed.worker_node, bed.worker_kubelet)
        bed.replace_worker_node()


def run_directory(bed: fullloop.FullLoopBed, name: str) -> Path:
    """The run's directory on its volume: <spec.checkpoint.path (none in the example)>/<namespace>/<run>."""
    return bed.runner.claim_directory(NAMESPACE, f"{name}-checkpoints") / NAMESPACE / name


def step_times(bed: fullloop.FullLoopBed, name: str) -> tuple[list[tuple[float, int, int]], dict[int, Any]]:
    """(time, attempt, step) of every finished step of the run, and each attempt's event log (from the PVC)."""
    claim = run_directory(bed, name)
    done: list[tuple[float, int, int]] = []
    logs: dict[int, list[dict[str, Any]]] = {}
    for path in sorted((claim / "attempts").glob("*/events.jsonl")):
        number = int(path.parent.name)
        logs[number] = events.read(path)
        done += [(e["t"], number, e["step"]) for e in logs[number] if e["event"] == "step_done"]
    return sorted(done), logs


def notice_saved(bed: fullloop.FullLoopBed, name: str, current: dict[str, Any], hit: Strike) -> bool:
    """Whether status records the checkpoint that answered the struck attempt's preemption notice: the step in the
    driver's answer (notice-answer.json, on the PVC), recorded for that attempt whatever its reason (a notice that
    came during a periodic save is answered by that save, recorded as Periodic)."""
    answer = run_directory(bed, name) / "attempts" / str(hit.attempt)
    try:
        step = json.loads((answer / notice.ANSWER_FILE).read_text()).get("step")
    except (OSError, ValueError):
        return False
    history = (current.get("checkpoints") or {}).get("history") or []
    return step is not None and any(c.get("step") == step and c.get("attempt") == hit.attempt for c in history)


def steps_per_s(done: list[tuple[float, int, int]], start: float, end: float) -> float:
    """Steps finished per second in [start, end)."""
    return sum(1 for t, _, _ in done if start <= t < end) / (end - start)


def measure_progress(plane: controlplane.ControlPlane, bed: fullloop.FullLoopBed, name: str,
                     hits: list[Strike]) -> dict[str, float]:  # fmt: skip
    """After the run: when training first passed each strike's step, the steps per second in the 30 s after it, and
    a head loss's stages, from the event logs of every attempt (on the PVC) and the run's status."""
    done, logs = step_times(bed, name)
    history = {a["number"]: a for a in status(plane, name).get("attempts") or []}
    rates = {}
    for i, hit in enumerate(hits):
        later = [t for t, _, s in done if t > hit.t and s > hit.reached]
        hit.progress_s = later[0] - hit.t if later else None
        rates[f"{hit.kind}#{i}"] = steps_per_s(done, hit.t, hit.t + 30)
        if hit.attempt + 1 in history and hit.kind in RESTARTS:
            hit.stages = restart_stages(hit, history, logs)
        resumed = (history.get(hit.attempt + 1) or {}).get("resumedFrom")
        if hit.kind == "driver_kill" and hit.attempt + 1 in history:
            finished = [s for _, a, s in done if a == hit.attempt]
            hit.lost_by_log = max(finished, default=0) - int(resumed or 0)
        replaced = replacement_time(logs.get(hit.attempt, []), hit.t)
        if hit.kind in WORKER_KINDS and replaced is not None:
            hit.replaced_s = replaced - hit.t
            rates[f"{hit.kind}#{i}:replaced"] = steps_per_s(done, replaced, replaced + 30)
    return rates


def replacement_time(log: list[dict[str, Any]], after: float) -> float | None:
    """When every generation worker lost after `after` had been replaced (its replacement held the current
    weights), from the attempt's event log; None if none was lost or one never came back in this attempt."""
    lost: set[int] = set()
    for e in log:
        if e["t"] < after:
            continue
        if e["event"] == "generator_lost":
            lost.add(e["slot"])
        elif e["event"] == "generator_replaced" and e["slot"] in lost:
            lost.discard(e["slot"])
            if not lost:
                return float(e["t"])
    return None


def restart_stages(hit: Strike, history: dict[int, dict[str, Any]], logs: dict[int, list[dict[str, Any]]]
                   ) -> dict[str, float]:  # fmt: skip
    """For a strike that ended its attempt: seconds from the strike to the end of each stage of the next attempt's
    start (second-precision API times, event-log times to the ms)."""
    ended = history.get(hit.attempt) or {}
    nxt = history.get(hit.attempt + 1) or {}
    log = {e["event"]: e["t"] for e in reversed(logs.get(hit.attempt + 1, []))}
    first_step = next((e["t"] for e in logs.get(hit.attempt + 1, []) if e["event"] == "step_done"), None)
    points = {
        "notice_answered": next((e["t"] for e in logs.get(hit.attempt, []) if e["event"] == "notice_answered"), None),
        "detected": ended.get("end"),
        "rayjob": nxt.get("start"),
        "cluster_ready": log.get("driver_started"),
        "restore": log.get("policy_loaded"),
        "setup": log.get("actor_created"),
        "first_step": first_step,
    }
    return {
        stage: round((timestamps.parse(v).timestamp() if isinstance(v, str) else v) - hit.t, 1)
        for stage, v in points.items()
        if v is not None
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=int(os.environ.get("BENCH_SEED", "7")))
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    kinds = ["worker_loss", "head_loss", "worker_loss", "driver_kill", "node_failure"]
    spots = sorted(rng.sample(range(SAVE_PERIOD // 2, args.steps - 5), len(kinds)))
    schedule = [Strike(kind, at) for kind, at in zip(kinds, spots, strict=True)]
    with controlplane.ControlPlane(nodes=1) as plane, fullloop.FullLoopBed.running(plane) as bed:
        bed.runner.grace_cap = 60.0  # pods get the grace period their spec asks for, as from a real kubelet
        operator = ourop.start(plane)
        try:
            plane.create_namespace(NAMESPACE)
            print(f"calm: {args.steps} steps, no disruption", flush=True)
            calm = run_once(plane, bed, "calm", args.steps, [], rng)
            calm_done, _ = step_times(bed, "calm")
            calm_rate = (len(calm_done) - 1) / (calm_done[-1][0] - calm_done[0][0])
            for hit in schedule:  # a kill without notice at a random moment of a save period, not just after one
                hit.delay_s = rng.uniform(0, SAVE_PERIOD / calm_rate) if hit.kind == "driver_kill" else 0.0
            print(f"calm: {calm:.0f} s; storm: {[(s.kind, s.at_step) for s in schedule]}", flush=True)
            storm = run_once(plane, bed, "storm", args.steps, schedule, rng)
            rates = measure_progress(plane, bed, "storm", schedule)
            final = status(plane, "storm")
            history = final.get("attempts") or []
            measured = measured_goodput(*step_times(bed, "storm"), history, final)
        finally:
            with contextlib.suppress(Exception):
                plane.kubectl("delete", "trainingruns.trainingrun.dev", "--all", "-n", NAMESPACE, "--wait=true",
                              "--timeout=90s", check=False, timeout=120)  # fmt: skip
            operator.stop()
    figures = figures_of(args, calm, storm, schedule, history)
    figures["calm_steps_per_s"] = round(calm_rate, 2)
    ratio = (final.get("goodput") or {}).get("ratio")
    figures["goodput_operator"] = ratio
    figures["goodput_measured"] = round(measured, 3)
    figures["goodput_operator_vs_measured_abs_diff"] = round(abs(ratio - measured), 3) if ratio is not None else None
    figures["goodput_operator_lost_s"] = (final.get("goodput") or {}).get("lostSeconds")
    figures["goals"]["goodput_operator_vs_measured_abs_diff"] = "<= 0.03"
    for kind in WORKER_KINDS:
        after = [r for k, r in rates.items() if k.startswith(f"{kind}#") and not k.endswith(":replaced")]
        back = [r for k, r in rates.items() if k.startswith(f"{kind}#") and k.endswith(":replaced")]
        figures[f"{kind}_steps_per_s_30s_after_vs_calm"] = round(min(after) / calm_rate, 2) if after else None
        figures[f"{kind}_steps_per_s_30s_after_replacement_vs_calm"] = round(min(back) / calm_rate, 2) if back else None
    results.merge("goodput", figures)
    print(json.dumps(figures, indent=2, sort_keys=True))
    return 0


def measured_goodput(
    done: list[tuple[float, int, int]],
    logs: dict[int, list[dict[str, Any]]],
    history: list[dict[str, Any]],
    final: dict[str, Any],
) -> float:
    """The storm's goodput from the drivers' event logs (`done`: time, attempt, step of every finished step; `logs`:
    each attempt's events): the steps the run kept are each attempt's past the step it resumed from, up to the step
    the next one resumed from; each costs the time since the step before it in the same attempt (an attempt's
    first, its median step time), less the time a save at the step before kept the train pump waiting (its
    `checkpoint_committed` event's blocked_s: the operator counts that as lost to checkpoints). Over the run's time:
    its first attempt's start (status) to its last finished step."""
    resumed = {int(a["number"]): int(a.get("resumedFrom") or 0) for a in history}
    attempts = sorted({a for _, a, _ in done})
    kept_s = 0.0
    for i, number in enumerate(attempts):
        upto = resumed.get(attempts[i + 1], 0) if i + 1 < len(attempts) else None
        mine = [
            (t, s) for t, a, s in done if a == number and s > resumed.get(number, 0) and (upto is None or s <= upto)
        ]
        gaps = [t - u for (u, _), (t, _) in itertools.pairwise(mine)]
        if mine:
            kept_s += sum(gaps) + (statistics.median(gaps) if gaps else 0.0)
            saved = {s for _, s in mine[:-1]}  # a save after one of these steps held back the next kept one
            kept_s -= sum(
                float(e.get("blocked_s") or 0.0)
                for e in logs.get(number, [])
                if e["event"] == "checkpoint_committed" and e["step"] in saved
            )
    start = timestamps.parse(final["startTime"]).timestamp()
    return kept_s / (done[-1][0] - start)


def figures_of(args: argparse.Namespace, calm: float, storm: float, schedule: list[Strike],
               history: list[dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    """An attempt that ended badly is charged to the last strike on it before its end (the one that ended it)."""
    failed = {h["number"]: h for h in history if h.get("reason") != "Succeeded"}
    charged: dict[int, Strike] = {}
    for hit in schedule:  # in order: a later strike on the same attempt replaces an earlier one
        if hit.attempt in failed and hit.t <= timestamps.parse(failed[hit.attempt]["end"]).timestamp() + 1:
            charged[hit.attempt] = hit
    figures: dict[str, Any] = {
        "steps": args.steps,
        "seed": args.seed,
        "schedule": [f"{s.kind}@{s.at_step}" for s in schedule],
        "calm_s": round(calm, 1),
        "storm_s": round(storm, 1),
        "goodput_under_disruption": round(calm / storm, 3),
        "attempts": max([h["number"] for h in history] + [1]),
        "goals": {
            "goodput_under_disruption": ">= 0.8",
            "worker_loss_steps_lost": "0",
            "worker_loss_new_attempts": "0",
            "graceful_head_loss_steps_lost": "0",
            "notice_to_recorded_checkpoint_s": "< 15",
            "steps_lost_per_unannounced_kill": "< save_period",
        },
    }
    for kind in ("worker_loss", "head_loss", "driver_kill", "node_failure"):
        hits = [s for s in schedule if s.kind == kind]
        ended = [failed[a] for a, s in charged.items() if s.kind == kind]
        figures[f"{kind}_new_attempts"] = len(ended)
        figures[f"{kind}_steps_lost"] = sum(int(e.get("stepsLost") or 0) for e in ended)
        progress = [s.progress_s for s in hits if s.progress_s is not None]
        figures[f"{kind}_to_progress_s"] = round(max(progress), 1) if progress else None
    # The head's eviction is graceful (its pod's grace period, the preStop hook asks the driver to save).
    figures["graceful_head_loss_steps_lost"] = figures["head_loss_steps_lost"]
    # The driver's SIGKILL gives no notice: it loses the steps since the newest recorded checkpoint.
    figures["save_period"] = SAVE_PERIOD
    # Counted from the killed attempt's own event log: status knows only the steps it reported before the kill.
    lost = [s.lost_by_log for s in schedule if s.kind == "driver_kill" and s.lost_by_log is not None]
    figures["steps_lost_per_unannounced_kill"] = sum(lost) / len(lost) if lost else None
    figures["unannounced_kills_at"] = [f"{s.reached}+{s.delay_s:.1f}s" for s in schedule if s.kind == "driver_kill"]
    noticed = [s.notice_recorded_s for s in schedule if s.kind == "head_loss"]
    figures["notice_to_recorded_checkpoint_s"] = (
        round(max(noticed), 1) if noticed and None not in noticed else None  # None: a notice saved nothing
    )
    for kind in RESTARTS:
        for stage, seconds in next((s.stages for s in schedule if s.kind == kind and s.stages), {}).items():
            figures[f"{kind}_stage_{stage}_s"] = seconds
    for kind in WORKER_KINDS:
        replaced = [s.replaced_s for s in schedule if s.kind == kind if s.replaced_s is not None]
        figures[f"{kind}_replacement_s"] = round(max(replaced), 1) if replaced else None
    return figures


if __name__ == "__main__":
    sys.exit(main())
