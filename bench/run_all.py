"""Runs every benchmark under bench/ one after the other and checks `bench-results.json`.

Called by `make bench`. Each `bench_*.py` merges its own figures into `bench-results.json` at the
repository root as `{benchmark: {figure: value}}`; this runner starts from an empty file, runs them in
a fixed order, then prints every figure and fails if a figure the architecture names is missing.
Benchmarks are not tests: they print ratios measured in one run on a shared, noisy machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import results  # bench/results.py: bench-results.json

ROOT = Path(__file__).resolve().parents[1]
ORDER = [
    "bench_imports.py",
    "bench_policy.py",
    "bench_checkpoint_100m.py",
    "bench_trainer_ranks.py",
    "bench_dataplane.py",
    "bench_grpo.py",
    "bench_operator.py",
    "bench_goodput.py",
]
REQUIRED = [
    "dataplane_import_cpu_gated_vs_plain",
    "hf_generate_vs_bare",
    "hf_train_vs_bare",
    "ckpt_save_vs_disk_100m",
    "ckpt_load_vs_disk_100m",
    "resume_to_first_step_s_100m",
    "ckpt_blocked_s_100m",
    "ckpt_sync_s_100m",
    "dp2_vs_dp1_tokens_per_s",
    "dataplane_save_vs_disk",
    "dataplane_load_vs_disk",
    "barrier_hold_vs_snapshot",
    "throughput_with_ckpt_vs_without",
    "throughput_ckpt_every_step_vs_none",
    "apply_to_rayjob_p99_ms",
    "kuberay_rayjob_to_raycluster_p99_ms",
    "failure_to_next_rayjob_ms_beyond_backoff",
    "operator_rss_mb_500_runs",
    "goodput_under_disruption",
    "goodput_operator_vs_measured_abs_diff",
    "worker_loss_steps_lost",
    "worker_loss_new_attempts",
    "graceful_head_loss_steps_lost",
    "notice_to_recorded_checkpoint_s",
    "steps_lost_per_unannounced_kill",
]


def main() -> int:
    results.PATH.write_text("{}\n")
    failed: list[str] = []
    for name in ORDER:
        started = time.monotonic()
        print(f"== {name}", flush=True)
        done = subprocess.run([sys.executable, str(ROOT / "bench" / name)], cwd=ROOT)
        print(f"== {name}: exit {done.returncode} in {time.monotonic() - started:.0f}s", flush=True)
        if done.returncode != 0:
            failed.append(name)
    found = json.loads(results.PATH.read_text())
    figures = {k: v for bench in found.values() if isinstance(bench, dict) for k, v in bench.items()}
    print("\n== bench-results.json")
    for bench, values in found.items():
        for key, value in values.items() if isinstance(values, dict) else []:
            print(f"{bench:>10}  {key:<48} {value}")
    missing = [k for k in REQUIRED if k not in figures]
    if missing:
        print(f"missing figures: {', '.join(missing)}", file=sys.stderr)
    if failed:
        print(f"failed benchmarks: {', '.join(failed)}", file=sys.stderr)
    return 1 if (missing or failed) else 0


if __name__ == "__main__":
    sys.exit(main())
