"""Benchmark: the CPU a process spends importing the data plane, with `dataplane.tq_modules` and without.

Every process that touches TransferQueue imports it, and with it tensordict, before it does anything of ours.
tensordict marks some of its functions for `torch.compile` as it is imported, which loads torch's compiler;
`tq_modules` imports it with those marks as the identity. That spares the driver, the controller actor,
TransferQueue's controller and each storage unit (the trainer worker loads the compiler anyway). In one run,
alternating, each a fresh interpreter:

    gated: import trainingrun_runtime.dataplane.lifecycle (through tq_modules)
    plain: import tensordict first (what any other import order did), then the same
        dataplane_import_cpu_gated_s, dataplane_import_cpu_plain_s: the median user+system CPU seconds
        dataplane_import_cpu_gated_vs_plain = gated / plain                              goal <= 0.75

Writes its figures under "imports" in bench-results.json at the repository root and prints them.

    .venv/bin/python bench/bench_imports.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys

import results  # bench/results.py: bench-results.json

GATED = "import trainingrun_runtime.dataplane.lifecycle"
PLAIN = "import tensordict; import trainingrun_runtime.dataplane.lifecycle"


def cpu_seconds(code: str) -> float:
    """User and system CPU of one fresh interpreter running `code`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", code], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args()
    cpu_seconds(GATED)  # the first import of a session also warms the page cache; not counted
    gated, plain = [], []
    for _ in range(a.repeat):
        gated.append(cpu_seconds(GATED))
        plain.append(cpu_seconds(PLAIN))
    figures = {
        "dataplane_import_cpu_gated_s": round(statistics.median(gated), 3),
        "dataplane_import_cpu_plain_s": round(statistics.median(plain), 3),
        "dataplane_import_cpu_gated_vs_plain": round(statistics.median(gated) / statistics.median(plain), 3),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    results.merge("imports", figures)
    for key, value in figures.items():
        print(f"{key:<40} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
