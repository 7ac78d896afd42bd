"""Benchmark: GRPO training throughput with a checkpoint every 10 steps vs none, and the resume start-up split.

    run A  savePeriod=10        ─┐  same config otherwise, launched back to back in this one invocation
    run B  no checkpoints        ─┘  (only the final save, which is outside the measured window)
    ratio  = steps/s(A) / steps/s(B)                          goal >= 0.95
    resume A with one more step ─► driver start → Ray started → TransferQueue started → restored
                                   → policy loaded → pumps running

Throughput is measured from the first to the last `step_done` event of a run (so Ray and
TransferQueue start-up are excluded, checkpoints between are included). Writes its
figures under "grpo" in bench-results.json at the repository root (merging with other
benchmarks' keys) and prints them.

    .venv/bin/python bench/bench_grpo.py [--steps 60] [--keep DIR]
    .venv/bin/python bench/bench_grpo.py --curve [--steps 120]     mean reward per step from random init
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from trainingrun_runtime import events, launcher

REPO = Path(__file__).resolve().parents[1]


def config(steps: int, save_period: int) -> dict[str, Any]:
    return {
        "trainer": {
            "steps": steps, "promptsPerStep": 8, "generationWorkers": 1, "logEvery": 10,
            "grpo": {"groupSize": 8}, "task": {"datasetSize": 4096},
        },
        "checkpoint": {"savePeriod": save_period, "keepLast": 2},
    }


def steps_per_s(log: list[dict[str, Any]], attempt_start: int = 0) -> float:
    done = [e for e in log[attempt_start:] if e["event"] == "step_done"]
    return float((len(done) - 1) / (done[-1]["t"] - done[0]["t"]))


def run(root: Path, name: str, cfg: dict[str, Any], attempt: int = 1) -> list[dict[str, Any]]:
    log_path = root / f"{name}.jsonl"
    proc = launcher.start(run=name, attempt=attempt, root=root, config=cfg, event_log=log_path)
    code = proc.wait(1800)
    if code != 0:
        raise SystemExit(f"{name} attempt {attempt} exited {code}:\n{proc.output()[-3000:]}")
    return events.read(log_path)


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
        print(f"steps {window[0]['step']:4d}-{window[-1]['step']:4d}  mean reward {mean:.3f}  "
              f"t={window[-1]['t'] - start:6.1f}s")
    return 0


def merge(results: dict[str, float]) -> None:
    path = REPO / "bench-results.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data["grpo"] = results
    tmp = path.with_suffix(".json.tmp-grpo")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--repeat", type=int, default=2, help="A/B pairs, interleaved; the best of each is kept")
    p.add_argument("--keep", type=Path, default=None, help="keep run directories here instead of a temp dir")
    p.add_argument("--curve", action="store_true", help="only train the default config and print the reward curve")
    a = p.parse_args()
    root = a.keep or Path(tempfile.mkdtemp(prefix="bench-grpo-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        if a.curve:
            return learning_curve(root, a.steps)
        # Interleaved A/B pairs on a shared machine; the best run of each side is the least disturbed one.
        without_rates, with_rates = [], []
        for i in range(a.repeat):
            without_rates.append(steps_per_s(run(root, f"nockpt{i}", config(a.steps, 10**6))))
            with_ckpt = run(root, f"ckpt{i}", config(a.steps, 10))
            with_rates.append(steps_per_s(with_ckpt))
        resumed = run(root, f"ckpt{a.repeat - 1}", config(a.steps + 1, 10), attempt=2)
        resumed_only = resumed[len(with_ckpt):]
        exclusive = [e["exclusive_s"] for e in with_ckpt if e["event"] == "checkpoint_committed"]
        results = {
            "steps_per_s_ckpt_every_10": max(with_rates),
            "steps_per_s_no_ckpt": max(without_rates),
            "repeats": float(a.repeat),
            "checkpoint_exclusive_s_mean": statistics.mean(exclusive),
            **startup_split(resumed_only),
        }
        results["throughput_with_ckpt_vs_without"] = (
            results["steps_per_s_ckpt_every_10"] / results["steps_per_s_no_ckpt"]
        )
        merge(results)
        print(json.dumps({"grpo": results}, indent=2, sort_keys=True))
    finally:
        if a.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
