"""Benchmark: what a checkpoint every 10 steps costs GRPO training, and the resume start-up split.

    one run, savePeriod=10:  step intervals that contain a checkpoint vs those that do not
        throughput_with_ckpt_vs_without = 10·t_plain / (9·t_plain + t_ckpt)           goal >= 0.95
        (t_plain, t_ckpt: median step interval without / with a checkpoint in it, same run, same load)
    resume it with one more step ─► driver start → Ray started → TransferQueue started → restored
                                   → policy loaded → pumps running
        resume_our_part_s = driver start to pumps, less Ray's own start                  goal < 5 s
        resume_worker_cpu_over_cores_s = the CPU our Ray actors' processes used by then, over the machine's cores:
            the least wall time their start can take on this machine, however it is ordered (each imports torch,
            and all but the generators TransferQueue and its tensordict, before it does anything of ours)
    one run at the example's savePeriod (manifests/examples/tiny.yaml), the same in-run figure:
        throughput_ckpt_example_period_vs_without
    a run saving at every step, then one that never saves (the policy's write, the fsync, the hashing and the
    commit run behind training; the pump waits only for the copy into host memory and the data-plane cut)
        throughput_ckpt_every_step_vs_none = steps/s of the first / of the second          goal >= 0.9
        checkpoint_blocked_s_median = how long a save kept the train pump waiting
    --ab: also separate runs without checkpoints, ABBA order (noisy on a shared machine)

The in-run figure is the honest one on this shared 2-core machine: across separate runs,
other jobs' load moved throughput by ±30%, more than the effect measured. Writes its
figures under "grpo" in bench-results.json at the repository root (merging with other
benchmarks' keys) and prints them.

    .venv/bin/python bench/bench_grpo.py [--steps 60] [--ab [--repeat 2]] [--keep DIR]
    .venv/bin/python bench/bench_grpo.py --curve [--steps 150]     mean reward per step from random init
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the test tooling's driver launcher (tests/support)

import results  # noqa: E402  (bench/results.py: bench-results.json)

from support import launcher  # noqa: E402
from trainingrun_operator.localmode import driver_process, processes  # noqa: E402
from trainingrun_runtime.driver import events  # noqa: E402

EXAMPLE = REPO / "manifests" / "examples" / "tiny.yaml"


def example_save_period() -> int:
    import yaml

    run = next(d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d and d.get("kind") == "TrainingRun")
    return int(run["spec"]["checkpoint"]["savePeriod"])


def config(steps: int, save_period: int) -> dict[str, Any]:
    return {
        "trainer": {
            "steps": steps,
            "promptsPerStep": 8,
            "generationWorkers": 1,
            "logEvery": 10,
            "grpo": {"groupSize": 8},
            "task": {"datasetSize": 4096},
        },
        "checkpoint": {"savePeriod": save_period, "keepLast": 2},
    }


def steps_per_s(log: list[dict[str, Any]], attempt_start: int = 0) -> float:
    done = [e for e in log[attempt_start:] if e["event"] == "step_done"]
    return float((len(done) - 1) / (done[-1]["t"] - done[0]["t"]))


def run(
    root: Path, name: str, cfg: dict[str, Any], attempt: int = 1, cpu: dict[str, float] | None = None
) -> list[dict[str, Any]]:
    """One attempt to its end; with `cpu`, fills it with the CPU its processes had used when its pumps started."""
    log_path = root / f"{name}.jsonl"
    before = len(events.read(log_path)) if log_path.exists() else 0  # an earlier attempt's log goes on in it
    proc = launcher.start(run=name, attempt=attempt, root=root, config=cfg, event_log=log_path)
    if cpu is not None:
        cpu.update(cpu_at_pumps(proc, log_path, skip=before))
    code = proc.wait(1800)
    if code != 0:
        raise SystemExit(f"{name} attempt {attempt} exited {code}:\n{proc.output()[-3000:]}")
    return events.read(log_path)


RAYS_OWN = {"ray::DashboardAgent", "ray::RuntimeEnvAgent", "ray::IDLE"}
"""Ray's processes named like workers that are not ours."""


def cpu_at_pumps(driver: launcher.Driver, log_path: Path, *, skip: int, timeout: float = 600.0) -> dict[str, float]:
    """CPU seconds (user + system) the attempt's processes had used when its pumps started, read from /proc.

    The driver starts a local Ray of its own, whose processes all carry the attempt's marker: the Ray workers (our
    actors: TransferQueue's controller and storage units, the trainer, the generators, the controller; "ray::"
    processes) apart from Ray's own (its agents, idle pooled workers, GCS, raylet). Sampled the moment
    `pumps_started` is logged; the workers' CPU over the machine's cores is the least wall time their start can take
    here, however it is ordered."""
    import psutil

    deadline = time.monotonic() + timeout
    while not (log_path.exists() and any(e["event"] == "pumps_started" for e in events.read(log_path)[skip:])):
        if time.monotonic() > deadline:
            raise SystemExit(f"no pumps_started in {log_path} within {timeout:g} s")
        time.sleep(0.05)
    workers, count, own = 0.0, 0, 0.0
    for pid in processes.carrying(driver_process.MARKER_ENV, driver.marker):
        try:
            proc = psutil.Process(pid)
            times = proc.cpu_times()
            name = proc.name()
            if name.startswith("ray::") and name not in RAYS_OWN:
                workers, count = workers + times.user + times.system, count + 1
            elif any("trainingrun_runtime" in a for a in proc.cmdline()):
                own += times.user + times.system
        except psutil.Error:
            continue  # gone meanwhile
    cores = os.cpu_count() or 1
    return {
        "resume_worker_processes": count,
        "resume_worker_cpu_s": workers,
        "resume_driver_cpu_s": own,
        "resume_worker_cpu_over_cores_s": workers / cores,
    }


def in_run_figures(log: list[dict[str, Any]], period: int) -> dict[str, float]:
    """Step intervals with and without a checkpoint in them, from one run's first attempt."""
    end = next(i for i, e in enumerate(log) if e["event"] == "finished")
    done = [e for e in log[:end] if e["event"] == "step_done"]
    interval = {b["step"]: b["t"] - a["t"] for a, b in itertools.pairwise(done)}
    # The checkpoint of step s (a multiple of period) runs between step_done(s) and step_done(s + 1).
    with_ckpt = [t for s, t in interval.items() if (s - 1) % period == 0]
    plain = [t for s, t in interval.items() if (s - 1) % period != 0]
    t_plain, t_ckpt = statistics.median(plain), statistics.median(with_ckpt)
    return {
        "steps_per_s_ckpt_every_10": steps_per_s(log[:end]),
        "step_s_plain_median": t_plain,
        "step_s_with_checkpoint_median": t_ckpt,
        "checkpoint_overhead_s": t_ckpt - t_plain,
        "throughput_with_ckpt_vs_without": period * t_plain / ((period - 1) * t_plain + t_ckpt),
    }


def startup_split(log: list[dict[str, Any]]) -> dict[str, float]:
    t = {e["event"]: e["t"] for e in log}
    return {
        "resume_ray_start_s": t["ray_started"] - t["driver_started"],
        "resume_tq_start_s": t["tq_started"] - t["ray_started"],
        "resume_tq_restore_s": t["tq_restored"] - t["tq_started"],
        "resume_model_load_s": t["policy_loaded"] - t["tq_restored"],
        "resume_generators_and_actor_s": t["pumps_started"] - t["policy_loaded"],
        "resume_driver_start_to_pumps_s": t["pumps_started"] - t["driver_started"],
    }


def learning_curve(root: Path, steps: int) -> int:
    """Train the default config from random init; print mean reward per step (and per 10 steps)."""
    cfg = {"trainer": {"steps": steps, "logEvery": 10}, "checkpoint": {"savePeriod": 50}}
    log = run(root, "curve", cfg)
    done = [e for e in log if e["event"] == "step_done"]
    start = next(e["t"] for e in log if e["event"] == "pumps_started")
    for i in range(0, len(done), 10):
        window = done[i : i + 10]
        mean = statistics.mean(e["reward"] for e in window)
        print(
            f"steps {window[0]['step']:4d}-{window[-1]['step']:4d}  mean reward {mean:.3f}  "
            f"t={window[-1]['t'] - start:6.1f}s"
        )
    return 0


def ab_figures(root: Path, steps: int, repeat: int) -> dict[str, Any]:
    """Separate runs with and without checkpoints, ABBA order; the best of each side."""
    without_rates: list[float] = []
    with_rates: list[float] = []
    for i in range(repeat):
        for side in ["nockpt", "ckpt"] if i % 2 == 0 else ["ckpt", "nockpt"]:
            period = 10**6 if side == "nockpt" else 10
            rate = steps_per_s(run(root, f"ab-{side}{i}", config(steps, period)))
            (without_rates if side == "nockpt" else with_rates).append(rate)
    return {
        "ab_steps_per_s_ckpt_every_10_all": with_rates,
        "ab_steps_per_s_no_ckpt_all": without_rates,
        "ab_throughput_with_ckpt_vs_without": max(with_rates) / max(without_rates),
    }


def every_step_figures(root: Path, steps: int) -> dict[str, Any]:
    """A run saving at every step against one that never saves, one after the other: what a checkpoint blocks, now
    that the policy's write, the fsync, the hashing and the commit run behind training."""
    every = run(root, "every-step", config(steps, 1))
    never = run(root, "never", config(steps, 10**6))
    blocked = [e["blocked_s"] for e in every if e["event"] == "checkpoint_committed"]
    return {
        "steps_per_s_ckpt_every_step": steps_per_s(every),
        "steps_per_s_no_ckpt": steps_per_s(never),
        "throughput_ckpt_every_step_vs_none": steps_per_s(every) / steps_per_s(never),
        "checkpoint_blocked_s_median": statistics.median(blocked),
        "checkpoints_every_step": len(blocked),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--ab", action="store_true", help="also compare against separate runs without checkpoints")
    p.add_argument("--repeat", type=int, default=2, help="--ab: A/B pairs in ABBA order; the best of each is kept")
    p.add_argument("--keep", type=Path, default=None, help="keep run directories here instead of a temp dir")
    p.add_argument("--curve", action="store_true", help="only train the default config and print the reward curve")
    a = p.parse_args()
    root = a.keep or Path(tempfile.mkdtemp(prefix="bench-grpo-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        if a.curve:
            return learning_curve(root, a.steps)
        with_ckpt = run(root, "ckpt", config(a.steps, 10))
        exclusive = [e["exclusive_s"] for e in with_ckpt if e["event"] == "checkpoint_committed"]
        figures: dict[str, Any] = {
            **in_run_figures(with_ckpt, 10),
            "checkpoint_exclusive_s_mean": statistics.mean(exclusive),
        }
        cpu: dict[str, float] = {}
        resumed = run(root, "ckpt", config(a.steps + 1, 10), attempt=2, cpu=cpu)
        figures.update(startup_split(resumed[len(with_ckpt) :]))
        figures.update(cpu)
        figures["resume_our_part_s"] = figures["resume_driver_start_to_pumps_s"] - figures["resume_ray_start_s"]
        period = example_save_period()
        at_example = run(root, "example-period", config(a.steps, period))
        figures["example_save_period"] = period
        figures["throughput_ckpt_example_period_vs_without"] = in_run_figures(at_example, period)[
            "throughput_with_ckpt_vs_without"
        ]
        figures.update(every_step_figures(root, a.steps))
        if a.ab:
            figures.update(ab_figures(root, a.steps, a.repeat))
        results.merge("grpo", figures)
        print(json.dumps({"grpo": figures}, indent=2, sort_keys=True))
    finally:
        if a.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
