"""Benchmark: a whole checkpoint of a ~100M-parameter model of the user's own, through the real driver.

    a Llama-shaped model of about 100M parameters saved with save_pretrained, a JSONL, reward `exact`
    attempt 1: 2 steps, savePeriod 2 ─► step_2 (weights 0.4 GB, AdamW 0.8 GB, the data plane, the manifest)
        ckpt_save_vs_disk_100m = raw fsynced write of as many bytes / the save (begin to commit)     goal >= 0.8
    attempt 2: resume from step_2, one more step
        ckpt_load_vs_disk_100m = raw cold read of step_2's bytes / the restore (verifying every
            checksum before Ray starts, then the data plane and the policy, each file read through its
            checked descriptor)                                                                   goal >= 0.8
        resume_to_first_step_s_100m = driver start to the first step of attempt 2, with its stages

One run of each on this shared 2-core machine, no GPU: the ratios compare operations measured minutes apart in the
same process tree, so they are figures of this machine on this day (docs/measurements.md), not of a cluster.
Writes its figures under "checkpoint_100m" in bench-results.json.

    .venv/bin/python bench/bench_checkpoint_100m.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the test tooling's driver launcher and tiny model directories

import results  # noqa: E402  (bench/results.py: bench-results.json)
from bench_dataplane import drop_cache, raw_read, raw_write  # noqa: E402

from support import hfmodels, launcher  # noqa: E402
from trainingrun_runtime.driver import events  # noqa: E402

HIDDEN, LAYERS = 768, 17
"""About 100M parameters: 17 blocks of a 768 wide attention (2.4M) and a 1536 wide MLP (3.5M)."""


def config(root: Path, steps: int) -> dict[str, Any]:
    return {
        "trainer": {
            "steps": steps,
            "promptsPerStep": 2,
            "generationWorkers": 1,
            "logEvery": 1,
            "model": {"path": str(root / "model")},
            "data": {"path": str(root / "problems.jsonl")},
            "reward": {"kind": "exact"},
            "generation": {"maxNewTokens": 4},
            "grpo": {"groupSize": 2, "lr": 1e-5},
        },
        "checkpoint": {"savePeriod": 2, "keepLast": 2},
    }


def attempt(root: Path, steps: int, number: int) -> list[dict[str, Any]]:
    log_path = root / "events.jsonl"
    before = len(events.read(log_path)) if log_path.exists() else 0
    proc = launcher.start(run="big", attempt=number, root=root, config=config(root, steps), event_log=log_path)
    code = proc.wait(3600)
    if code != 0:
        raise SystemExit(f"attempt {number} exited {code}:\n{proc.output()[-3000:]}")
    return events.read(log_path)[before:]


def step_bytes(step_dir: Path) -> tuple[list[Path], int]:
    found = [p for p in step_dir.rglob("*") if p.is_file()]
    return found, sum(p.stat().st_size for p in found)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--keep", type=Path, default=None, help="work in this directory and keep it")
    a = p.parse_args()
    root = a.keep or Path(tempfile.mkdtemp(prefix="bench-ckpt-100m-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        from safetensors.torch import load_file

        hfmodels.llama_dir(root / "model", hidden=HIDDEN, layers=LAYERS, heads=12)
        params = sum(t.numel() for t in load_file(root / "model" / "model.safetensors").values())
        with open(root / "problems.jsonl", "w") as f:
            for i in range(64):
                f.write(json.dumps({"prompt": f"{i % 10} + {i % 7} =", "answer": "answer"}) + "\n")

        first = attempt(root, steps=2, number=1)
        committed = next(e for e in first if e["event"] == "checkpoint_committed" and e["step"] == 2)
        files, size = step_bytes(root / "big" / "step_2")
        payload = bytes(size)
        scratch = root / "raw.bin"
        raw_write_s = raw_write(scratch, payload)
        del payload
        raw_read_s = raw_read(scratch, size)
        scratch.unlink()

        drop_cache(files)  # the restore reads from disk, as the raw read did
        second = attempt(root, steps=3, number=2)
        t = {e["event"]: e["t"] for e in second if e["event"] != "step_done"}
        first_step = next(e["t"] for e in second if e["event"] == "step_done")
        verify_s = t["checkpoint_selected"] - t["run_dir_claimed"]
        load_s = t["policy_loaded"] - t["tq_started"]
        figures = {
            "ckpt_model_parameters_100m": params,
            "ckpt_bytes_100m": size,
            "ckpt_save_s_100m": committed["committed_s"],
            "ckpt_raw_write_s_100m": raw_write_s,
            "ckpt_save_vs_disk_100m": raw_write_s / committed["committed_s"],
            "ckpt_restore_s_100m": verify_s + load_s,
            "ckpt_raw_read_s_100m": raw_read_s,
            "ckpt_load_vs_disk_100m": raw_read_s / (verify_s + load_s),
            "resume_to_first_step_s_100m": first_step - t["driver_started"],
            "resume_100m_verify_s": verify_s,
            "resume_100m_ray_start_s": t["ray_started"] - t["checkpoint_selected"],
            "resume_100m_trainer_and_tq_start_s": t["tq_started"] - t["ray_started"],
            "resume_100m_data_plane_restore_s": t["tq_restored"] - t["tq_started"],
            "resume_100m_policy_load_s": t["policy_loaded"] - t["tq_restored"],
            "resume_100m_generators_s": t["generators_ready"] - t["policy_loaded"],
            "resume_100m_actor_to_first_step_s": first_step - t["generators_ready"],
        }
        results.merge("checkpoint_100m", figures)
        for key, value in figures.items():
            print(f"{key:<40} {value:.3f}" if isinstance(value, float) else f"{key:<40} {value}")
        return 0
    finally:
        if a.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    started = time.monotonic()
    code = main()
    print(f"bench_checkpoint_100m: {time.monotonic() - started:.0f} s", file=sys.stderr)
    sys.exit(code)
