"""Benchmark (not a test): data-plane checkpoint save/load against raw disk, and the barrier's exclusive window.

For 20 MiB and 200 MiB of GRPO-like rows (per row: 1024 int64 tokens, 1024 float32 log-probs,
1024 float32 advantages, one float32 reward; groups of 8, put 256 rows at a time) on a real local
Ray and TransferQueue (2 storage units), it measures:

- save:  `DataPlaneClient.save_checkpoint` + fsync of every file it wrote (a durable snapshot),
         against writing the same number of raw bytes to one file + fsync;
- load:  `BootstrapDataPlane.load_checkpoint` into a fresh TransferQueue, against reading the same
         number of raw bytes; both start cold (pages dropped with posix_fadvise after the fsync);
- the barrier: a full `DataPlaneCheckpointer` snapshot while rollouts keep committing groups; its
         exclusive window (index + inventory check + TQ write) against the durable snapshot time;
- the storage fix: snapshot size and time of rows put 256 at a time, stock 0.1.11 units vs the fix
         (`--stock-mib`, one storage unit; stock writes about 256x the raw bytes).

Ratios are bandwidth ratios (raw time / data-plane time; 1.0 = as fast as raw disk). Each figure is
the median of several runs. The headline figures are the worst over the two sizes, merged into
`bench-results.json` at the repository root under "dataplane" (read-modify-write; other benchmarks
keep their keys):

    dataplane_save_vs_disk    raw fsynced write time / durable TQ save time   (goal >= 0.8)
    dataplane_load_vs_disk    raw cold read time / TQ load time               (goal >= 0.8)
    barrier_hold_vs_snapshot  exclusive window / durable snapshot time        (goal <= 1.0)

Run: `.venv/bin/python bench/bench_dataplane.py [--sizes 20 200] [--repeats 3]`.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
import torch

from trainingrun_runtime.barrier import DataPlaneCheckpointBarrier
from trainingrun_runtime.checkpoint import DataPlaneCheckpointer
from trainingrun_runtime.dataplane import BootstrapDataPlane, ConnectOnlyDataPlane
from trainingrun_runtime.replay_buffer import GroupRows, TQReplayBuffer

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench-results.json"
SEQ = 1024
ROW_BYTES = SEQ * (8 + 4 + 4) + 4
GROUP = 8
PUT_ROWS = 256
PARTITION = "bench"
UNITS = 2


def rows(n: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "tokens": torch.randint(0, 50_000, (n, SEQ), generator=gen),
        "logprobs": torch.randn(n, SEQ, generator=gen),
        "advantages": torch.randn(n, SEQ, generator=gen),
        "reward": torch.rand(n, generator=gen),
    }


def files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file())


def fsync_tree(path: Path) -> None:
    """Fsync every file (in parallel, as the bundle commit does), then the directories bottom-up."""

    def sync(p: Path, flags: int = os.O_RDONLY) -> None:
        fd = os.open(p, flags)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    files = files_under(path)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(sync, files))
    for d in sorted({p.parent for p in files} | {path}, key=lambda p: len(p.parts), reverse=True):
        sync(d, os.O_RDONLY | os.O_DIRECTORY)


def drop_cache(paths: list[Path]) -> None:
    """Evict clean pages so the next read comes from disk (the files were fsynced)."""
    for f in paths:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def raw_write(path: Path, payload: bytes) -> float:
    started = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(dfd)
    os.close(dfd)
    return time.perf_counter() - started


def raw_read(path: Path, size: int) -> float:
    drop_cache([path])
    buf = bytearray(size)
    started = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        view = memoryview(buf)
        got = 0
        while got < size:
            n = f.readinto(view[got:])
            if not n:
                raise OSError(f"{path}: short read")
            got += n
    return time.perf_counter() - started


def fill(client: ConnectOnlyDataPlane, buffer: TQReplayBuffer, n_rows: int) -> None:
    """Reserve and commit every group in the index, putting the rows 256 at a time."""
    for start in range(0, n_rows, PUT_ROWS):
        count = min(PUT_ROWS, n_rows - start)
        groups = [buffer.index.reserve(f"g{(start + i) // GROUP}").rows for i in range(0, count, GROUP)]
        client.put_groups(PARTITION, groups, rows(count, start))
        for g in groups:
            buffer.index.commit(g.group_id)


async def barrier_runs(client: ConnectOnlyDataPlane, buffer: TQReplayBuffer, root: Path, repeats: int
                       ) -> list[dict[str, float]]:  # fmt: skip
    return [await barrier_run(client, buffer, root, step) for step in range(repeats)]


async def barrier_run(client: ConnectOnlyDataPlane, buffer: TQReplayBuffer, root: Path, step: int) -> dict[str, float]:
    """One checkpoint snapshot while a rollout lane keeps committing groups; returns its timings."""
    saver = DataPlaneCheckpointer(root, "bench", dataplane=client, buffer=buffer, barrier=buffer.barrier)
    stop = asyncio.Event()
    committed = 0

    async def rollouts() -> None:
        nonlocal committed
        while not stop.is_set():
            gid = f"live{step}-{committed}"
            await buffer.reserve(gid)
            await buffer.commit(gid, rows(GROUP, committed))
            committed += 1

    lane = asyncio.create_task(rollouts())
    await asyncio.sleep(0.2)
    pending = saver.begin(step)
    snap = await pending.snapshot()
    synced = time.perf_counter()
    fsync_tree(pending.path / "data_plane")
    fsync_s = time.perf_counter() - synced
    stop.set()
    await lane
    pending.abort()
    return {
        "exclusive_s": snap.exclusive_s,
        "hold_s": snap.hold_s,
        "tq_write_s": snap.snapshot_s,
        "capture_and_check_s": snap.check_s,
        "durable_snapshot_s": snap.snapshot_s + fsync_s,
        "commits_during_run": float(committed),
    }


def measure(mib: int, workdir: Path, repeats: int) -> dict[str, Any]:
    n_rows = max(PUT_ROWS, (mib << 20) // ROW_BYTES // GROUP * GROUP)
    raw_bytes = n_rows * ROW_BYTES
    print(f"\n== {mib} MiB: {n_rows} rows, {raw_bytes / 2**20:.1f} MiB raw ==", flush=True)
    boot = BootstrapDataPlane.start(storage_units=UNITS)
    client = ConnectOnlyDataPlane.connect(boot.start_fresh())
    buffer = TQReplayBuffer(
        client, DataPlaneCheckpointBarrier(), partition=PARTITION, group_size=GROUP, capacity=1 << 20
    )
    fill(client, buffer, n_rows)

    # Raw and data-plane writes alternate, each after a sync, so background writeback and the
    # machine's load hit both alike.
    payload = os.urandom(raw_bytes)
    raw_file = workdir / f"raw{mib}.bin"
    saves, raw_writes, snapshot_dirs = [], [], []
    for i in range(repeats):
        os.sync()
        raw_writes.append(raw_write(raw_file, payload))
        target = workdir / f"save{mib}_{i}"
        os.sync()
        started = time.perf_counter()
        client.save_checkpoint(target, {"bench": mib})
        fsync_tree(target)
        saves.append(time.perf_counter() - started)
        snapshot_dirs.append(target)
    written = sum(f.stat().st_size for f in files_under(snapshot_dirs[0]))
    del payload
    raw_reads = []

    runs = asyncio.run(barrier_runs(client, buffer, workdir / f"ckpt{mib}", repeats))
    boot.close()

    loads = []
    for i in range(repeats):
        fresh = BootstrapDataPlane.start(storage_units=UNITS)
        source = snapshot_dirs[i % len(snapshot_dirs)]
        raw_reads.append(raw_read(raw_file, raw_bytes))  # cold, right before the cold data-plane load
        drop_cache(files_under(source))
        started = time.perf_counter()
        token, _ = fresh.load_checkpoint(source)
        loads.append(time.perf_counter() - started)
        restored = ConnectOnlyDataPlane.connect(token).list_sample_ids(PARTITION)
        assert len(restored) == n_rows, (len(restored), n_rows)
        fresh.close()
    for d in snapshot_dirs:
        shutil.rmtree(d)
    raw_file.unlink()

    med = statistics.median
    b = {k: med(r[k] for r in runs) for k in runs[0]}
    out = {
        "rows": n_rows,
        "raw_mib": raw_bytes / 2**20,
        "snapshot_vs_raw_bytes": written / raw_bytes,
        "tq_save_s": med(saves),
        "raw_write_fsync_s": med(raw_writes),
        "tq_load_s": med(loads),
        "raw_read_cold_s": med(raw_reads),
        "save_vs_disk": med(raw_writes) / med(saves),
        "load_vs_disk": med(raw_reads) / med(loads),
        "barrier_exclusive_s": b["exclusive_s"],
        "barrier_hold_s": b["hold_s"],
        "barrier_tq_write_s": b["tq_write_s"],
        "barrier_capture_and_check_s": b["capture_and_check_s"],
        "barrier_durable_snapshot_s": b["durable_snapshot_s"],
        "barrier_exclusive_vs_snapshot": b["exclusive_s"] / b["durable_snapshot_s"],
        "barrier_exclusive_vs_tq_write": b["exclusive_s"] / b["tq_write_s"],
        "commits_during_barrier_run": b["commits_during_run"],
    }
    for key, value in out.items():
        print(f"  {key:32s} {value:10.4f}" if isinstance(value, float) else f"  {key:32s} {value:10d}")
    return out


def compare_stock(mib: int, workdir: Path) -> dict[str, float]:
    """Snapshot size and time of the same rows (put 256 at a time, one storage unit), stock 0.1.11 vs the fix.

    Bench-only: starts one TransferQueue with 0.1.11's own storage units by skipping `install()`.
    """
    from transfer_queue.storage import simple_storage  # type: ignore[import-untyped]
    from transfer_queue.storage.bootstrap import simple_storage_bootstrap  # type: ignore[import-untyped]

    from trainingrun_runtime import tq_storage_fix

    n_rows = max(PUT_ROWS, (mib << 20) // ROW_BYTES // PUT_ROWS * PUT_ROWS)
    raw_bytes = n_rows * ROW_BYTES
    out: dict[str, float] = {"rows": float(n_rows), "raw_mib": raw_bytes / 2**20}
    for label in ("stock", "fixed"):
        install = tq_storage_fix.install
        if label == "stock":
            tq_storage_fix.install = lambda: None
            simple_storage_bootstrap.SimpleStorageUnit = simple_storage.SimpleStorageUnit
        try:
            boot = BootstrapDataPlane.start(storage_units=1)
        finally:
            tq_storage_fix.install = install
        client = ConnectOnlyDataPlane.connect(boot.start_fresh())
        for start in range(0, n_rows, PUT_ROWS):
            groups = [GroupRows(f"g{(start + i) // GROUP}", tuple(f"g{(start + i) // GROUP}:{m}" for m in range(GROUP)))
                      for i in range(0, PUT_ROWS, GROUP)]  # fmt: skip
            client.put_groups(PARTITION, groups, rows(PUT_ROWS, start))
        target = workdir / f"{label}{mib}"
        started = time.perf_counter()
        client.save_checkpoint(target, {"bench": label})
        fsync_tree(target)
        out[f"{label}_save_s"] = time.perf_counter() - started
        out[f"{label}_snapshot_vs_raw_bytes"] = sum(f.stat().st_size for f in files_under(target)) / raw_bytes
        shutil.rmtree(target)
        boot.close()
        ratio, took = out[f"{label}_snapshot_vs_raw_bytes"], out[f"{label}_save_s"]
        print(f"  {label:6s} snapshot {ratio:8.2f}x raw, save {took:.2f} s")
    return out


def merge(figures: dict[str, Any]) -> None:
    current: dict[str, Any] = {}
    if RESULTS.exists():
        try:
            current = json.loads(RESULTS.read_text())
        except ValueError:
            current = {}
    current["dataplane"] = figures
    tmp = RESULTS.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, RESULTS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[20, 200], help="MiB of rows")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None, help="where snapshots go (default: a temp dir)")
    parser.add_argument("--stock-mib", type=int, default=4, help="MiB for the stock-vs-fix size comparison (0: skip)")
    args = parser.parse_args()
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    workdir = Path(tempfile.mkdtemp(prefix="bench-dataplane-", dir=args.workdir))
    try:
        stock = {}
        if args.stock_mib:
            print(f"\n== stock 0.1.11 vs the fix: {args.stock_mib} MiB put 256 rows at a time ==", flush=True)
            stock = compare_stock(args.stock_mib, workdir)
        per_size = {f"{mib}MiB": measure(mib, workdir, args.repeats) for mib in args.sizes}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        ray.shutdown()
    figures: dict[str, Any] = {
        "dataplane_save_vs_disk": min(s["save_vs_disk"] for s in per_size.values()),
        "dataplane_load_vs_disk": min(s["load_vs_disk"] for s in per_size.values()),
        "barrier_hold_vs_snapshot": max(s["barrier_exclusive_vs_snapshot"] for s in per_size.values()),
        "sizes": per_size,
        "storage_fix": stock,
        "machine": {"cpus": os.cpu_count(), "loadavg_1m_5m_at_end": list(os.getloadavg()[:2])},
    }
    merge(figures)
    print("\n" + json.dumps({k: v for k, v in figures.items() if k not in ("sizes", "storage_fix")}, indent=2))


if __name__ == "__main__":
    main()
