"""Data-plane checkpoints end to end, with real local Ray and real TransferQueue 0.1.11.

- A checkpoint saved here is restored by a NEW process with its own fresh Ray and TransferQueue:
  rows, tags, fields, consumption state, the index and the captured restart state come back
  identical, and that restore falls back over a newer, corrupt step on its way.
- An inventory mismatch leaves no step_N.
- The corruption matrix: each damaged checkpoint is refused with a message naming the file and the
  problem, and selection falls back to the previous valid step (selection runs every check before
  anything reaches TransferQueue, so it is exercised here without loading).
- Crash consistency: a saver attached to this module's TransferQueue SIGKILLs itself between every
  two steps of the save; the newest valid checkpoint afterwards is the new one, complete, or the previous.

Subprocesses import this module for their entry points (`child_restore`, `child_crash`).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import ray
import torch
import transfer_queue as tq  # type: ignore[import-untyped]

from support import bundles, saving
from trainingrun_runtime import digest
from trainingrun_runtime.dataplane import checkpointer
from trainingrun_runtime.dataplane.barrier import DataPlaneCheckpointBarrier
from trainingrun_runtime.dataplane.checkpointer import (
    SAVE_STAGES,
    DataPlaneCheckpointer,
)
from trainingrun_runtime.dataplane.lifecycle import (
    BootstrapDataPlane,
    ConnectOnlyDataPlane,
    DataPlaneToken,
)
from trainingrun_runtime.dataplane.replay_buffer import TQReplayBuffer
from trainingrun_runtime.dataplane.replay_index import GroupRows, ReplayConfig
from trainingrun_runtime.dataplane.row_client import DataPlaneClient
from trainingrun_runtime.errors import CheckpointCorrupt, DigestError, InventoryMismatch
from trainingrun_runtime.storage import commit, files, layout

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

RUN = "exp"
HERE = Path(__file__).resolve().parent
TRAIN = ReplayConfig("train", 4, 64)


class Plane(NamedTuple):
    """The module's TransferQueue: its bootstrap client, a connect-only client, and the token."""

    boot: BootstrapDataPlane
    client: ConnectOnlyDataPlane
    token: DataPlaneToken


@pytest.fixture(scope="module")
def plane() -> Iterator[Plane]:
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    boot = BootstrapDataPlane.start(storage_units=2)
    try:
        token = boot.start_fresh()
        yield Plane(boot, ConnectOnlyDataPlane.connect(token), token)
    finally:
        boot.close()
        ray.shutdown()


def new_buffer(client: DataPlaneClient, config: ReplayConfig) -> tuple[TQReplayBuffer, DataPlaneCheckpointBarrier]:
    barrier = DataPlaneCheckpointBarrier()
    buffer = TQReplayBuffer(
        client, barrier, partition=config.partition, group_size=config.group_size, capacity=config.capacity
    )
    return buffer, barrier


def group_fields(g: int, size: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(g)
    return {
        "tokens": torch.randint(0, 1000, (size, 32), generator=gen),
        "logprobs": torch.randn(size, 32, generator=gen),
        "reward": torch.rand(size, generator=gen),
        "response": [torch.arange(1 + (g + m) % 5) for m in range(size)],
        "text": [f"group {g} member {m}" for m in range(size)],
    }


async def add_groups(buffer: TQReplayBuffer, groups: range) -> None:
    size = buffer.config.group_size
    for g in groups:
        await buffer.reserve(f"g{g}", meta={"prompt": g, "version": g // 2})
        await buffer.commit(f"g{g}", group_fields(g, size), tags=[{"member": m} for m in range(size)])


def observe(client: DataPlaneClient, partition: str, index: dict[str, Any]) -> dict[str, Any]:
    """Everything a restore must bring back, as plain values and tensors."""
    inventory = client.inventory(partition)
    assert inventory is not None
    rows: dict[str, dict[str, Any]] = {}
    for group in index["groups"]:
        got = client.read_rows(partition, group["sample_ids"])
        rows[group["group_id"]] = {
            k: v if isinstance(v, torch.Tensor) else [_plain(x) for x in v] for k, v in got.items()
        }
    return {
        "ids": client.list_sample_ids(partition),
        "inventory": {sid: [dict(r.tags), list(r.fields), list(r.consumed_by)] for sid, r in inventory.rows.items()},
        "consumed": dict(inventory.consumed),
        "index": index,
        "rows": rows,
    }


def _plain(x: Any) -> Any:
    return x.tolist() if isinstance(x, torch.Tensor) else x


def assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for key in ("ids", "inventory", "consumed", "index"):
        assert a[key] == b[key], key
    assert a["rows"].keys() == b["rows"].keys()
    for gid, fields in a["rows"].items():
        assert fields.keys() == b["rows"][gid].keys(), gid
        for name, value in fields.items():
            other = b["rows"][gid][name]
            if isinstance(value, torch.Tensor):
                assert isinstance(other, torch.Tensor) and value.dtype == other.dtype and torch.equal(value, other)
            else:
                assert value == other, (gid, name)


def run_child(entry: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    path = [str(HERE), str(HERE.parent)]
    code = f"import sys; sys.path[:0] = {path!r}; import test_checkpointer as t; t.{entry}(*sys.argv[1:])"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout, env=env)


# -- save here, restore in a new process ---------------------------------------------------------------


async def test_a_new_process_restores_rows_tags_consumption_and_the_index_exactly(plane: Plane, tmp_path: Path) -> None:
    client = plane.client
    buffer, barrier = new_buffer(client, TRAIN)
    await add_groups(buffer, range(6))
    client.update_fields("train", list(buffer.index.get("g1").sample_ids), {"advantage": torch.linspace(-1, 1, 4)})
    client.update_fields("train", list(buffer.index.get("g4").sample_ids), {"advantage": torch.zeros(4)})
    await buffer.remove_group("g2")
    consumed = tq.get_client().get_meta(
        data_fields=["tokens"], batch_size=4, partition_id="train", mode="fetch", task_name="actor_update"
    )
    assert consumed.size == 4
    saver = DataPlaneCheckpointer(tmp_path, RUN, dataplane=client, buffer=buffer, barrier=barrier)
    restart = {"loader": {"epoch": 0, "position": 17}, "sampler": {"step": 3}, "ledger": [[5, "in_flight"]]}
    step1, snap = await saving.save(
        saver, 1, attempt=2, config_hash="cfg", capture=lambda: restart, weights_sha256="ab" * 32, extra={"note": "one"}
    )
    assert snap.groups == 5 and snap.rows == 20 and snap.exclusive_s >= snap.snapshot_s > 0
    expected = observe(client, "train", buffer.metadata_state_dict())
    assert expected["consumed"] == {"actor_update": 4}

    await add_groups(buffer, range(6, 8))  # a newer step, which will be damaged
    step2, _ = await saving.save(saver, 2, attempt=2, config_hash="cfg")
    victim = next((step2 / "data_plane" / "simple_storage").glob("su_1_*.pkl"))
    bundles.flip_middle_byte(victim)
    torch.save(expected, tmp_path / "expected.pt")

    done = run_child("child_restore", str(tmp_path), str(tmp_path / "observed.pt"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    observed = torch.load(tmp_path / "observed.pt", weights_only=False)
    assert observed["step"] == 1 and observed["path"] == str(step1)
    assert observed["restart"] == restart
    assert observed["manifest"] == {"attempt": 2, "weights_sha256": "ab" * 32, "extra": {"note": "one"}}
    [(skipped_path, reason)] = observed["skipped"]
    assert skipped_path == str(step2) and f"{victim}: checksum mismatch" in reason
    assert_same(observed["state"], expected)


def child_restore(root: str, out: str) -> None:
    """Runs in a new process: fresh Ray, fresh TransferQueue, restore, rebuild the index, report."""
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    boot = BootstrapDataPlane.start(storage_units=2)
    try:
        # The driver's restore path (`driver.restore`), its data-plane half: select, then load onto a pristine TQ.
        chosen = checkpointer.select(root, RUN, config=TRAIN, storage_units=boot.storage_units)
        assert chosen is not None
        token, _ = boot.load_checkpoint(chosen.verified.data_plane, chosen.verified.entries(layout.DATA_PLANE))
        client = ConnectOnlyDataPlane.connect(token)
        buffer, _ = new_buffer(client, TRAIN)
        asyncio.run(buffer.restore(chosen.replay_state, expected_digest=chosen.manifest.replay_digest))
        torch.save(
            {
                "step": chosen.manifest.step,
                "path": str(chosen.verified.path),
                "restart": dict(chosen.restart),
                "manifest": {
                    "attempt": chosen.manifest.attempt,
                    "weights_sha256": chosen.manifest.weights_sha256,
                    "extra": dict(chosen.manifest.extra),
                },
                "skipped": [(str(p), why) for p, why in chosen.skipped],
                "state": observe(client, "train", buffer.metadata_state_dict()),
            },
            out,
        )
    finally:
        boot.close()
        ray.shutdown()


@pytest.mark.parametrize("victim", ["simple_storage/su_1_*.pkl", "controller_state.pkl"])
async def test_a_data_plane_file_replaced_after_selection_is_refused_by_the_process_that_reads_it(
    plane: Plane, tmp_path: Path, victim: str
) -> None:
    """Selection verified step 2; then its storage unit's file is replaced by rename with step 1's (the same rows
    with older values), or its controller state with one whose partition is renamed (a valid pickle of the same
    size). Every process that reads a file of the snapshot reads it through the descriptor it checks against the
    manifest's entry, so the load is refused naming the file; unchecked, the other state would have been loaded
    as step 2's. (The unit's file is refused in the unit's process; the controller's state already by the
    driver's parse-only check before TransferQueue's load, which reads it the same way.)"""
    client = plane.client
    config = ReplayConfig(f"swap-{victim[:2]}", 4, 64)
    buffer, barrier = new_buffer(client, config)
    saver = DataPlaneCheckpointer(tmp_path, RUN, dataplane=client, buffer=buffer, barrier=barrier)
    await add_groups(buffer, range(2))
    step1, _ = await saving.save(saver, 1, attempt=1, config_hash="cfg")
    # Step 2: the same rows with other values, so that step 1's unit files are valid and of the same size (the
    # driver's listing check would refuse another size before any unit reads its file).
    for g in range(2):
        client.update_fields(config.partition, list(buffer.index.get(f"g{g}").sample_ids), {"reward": torch.ones(4)})
    await saving.save(saver, 2, attempt=1, config_hash="cfg")
    [older] = (step1 / layout.DATA_PLANE).glob(victim)
    rel = str(older.relative_to(step1))
    done = run_child("child_restore_swapped", str(tmp_path), config.partition, rel, str(tmp_path / "out"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    said = (tmp_path / "out").read_text()
    swapped = tmp_path / RUN / "step_2" / older.relative_to(step1)
    assert re.search(rf"{re.escape(str(swapped))}: (checksum mismatch|\d+ bytes, the manifest says)", said), said


def child_restore_swapped(root: str, partition: str, rel: str, out: str) -> None:
    """Runs in a new process: select the newest step, replace its file `rel` with step 1's, then load it."""
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    boot = BootstrapDataPlane.start(storage_units=2)
    try:
        chosen = checkpointer.select(root, RUN, config=ReplayConfig(partition, 4, 64), storage_units=2)
        assert chosen is not None and chosen.manifest.step == 2
        step = chosen.verified.path
        if rel.endswith("controller_state.pkl"):
            renamed = (step / rel).read_bytes().replace(partition.encode(), partition[:-1].encode() + b"X")
            (step / (rel + ".swap")).write_bytes(renamed)
        else:
            shutil.copyfile(step.parent / "step_1" / rel, step / (rel + ".swap"))
        os.replace(step / (rel + ".swap"), step / rel)
        try:
            boot.load_checkpoint(chosen.verified.data_plane, chosen.verified.entries(layout.DATA_PLANE))
        except Exception as e:
            Path(out).write_text(f"{type(e).__name__}: {e}")
        else:
            Path(out).write_text("loaded")
    finally:
        boot.close()
        ray.shutdown()


# -- inventory --------------------------------------------------------------------------------------


@pytest.mark.parametrize("drift", ["row-not-indexed", "indexed-row-missing"])
async def test_an_inventory_mismatch_leaves_no_step(plane: Plane, tmp_path: Path, drift: str) -> None:
    client = plane.client
    config = ReplayConfig(f"drift-{drift}", 2, 8)
    buffer, barrier = new_buffer(client, config)
    await add_groups(buffer, range(2))
    if drift == "row-not-indexed":
        stray = [GroupRows("stray", ("stray:0", "stray:1"))]
        client.put_groups(config.partition, stray, group_fields(9, 2))
        match = r"2 stored but not indexed \['stray:0', 'stray:1'\], 0 indexed but not stored \[\]"
    else:
        client.clear_groups(config.partition, [buffer.index.get("g0").rows])
        match = r"0 stored but not indexed \[\], 2 indexed but not stored \['g0:0', 'g0:1'\]"
    saver = DataPlaneCheckpointer(tmp_path, RUN, dataplane=client, buffer=buffer, barrier=barrier)
    with pytest.raises(InventoryMismatch, match=match):
        await saving.save(saver, 1, attempt=1, config_hash="cfg")
    assert sorted(p.name for p in (tmp_path / RUN).iterdir()) == []
    assert barrier.stats.pending_checkpoints == 0 and barrier.stats.checkpoints == 1


# -- corruption matrix --------------------------------------------------------------------------------

MATRIX = ReplayConfig("matrix", 2, 16)


@pytest.fixture(scope="module")
def template(plane: Plane, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two valid checkpoints, steps 1 and 2, of one run."""
    client = plane.client
    root = tmp_path_factory.mktemp("template")

    async def save_two() -> None:
        buffer, barrier = new_buffer(client, MATRIX)
        saver = DataPlaneCheckpointer(root, RUN, dataplane=client, buffer=buffer, barrier=barrier)
        await add_groups(buffer, range(3))
        await saving.save(saver, 1, attempt=1, config_hash="cfg")
        await add_groups(buffer, range(3, 5))
        await saving.save(saver, 2, attempt=1, config_hash="cfg")

    asyncio.run(save_two())
    return root


def _flip(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 3] ^= 0x01
    path.write_bytes(bytes(raw))


def _forge_sidecar(step: Path) -> None:
    """A sidecar that is internally consistent and checksummed, but describes other groups than the manifest."""
    sidecar = torch.load(step / layout.REPLAY_METADATA, weights_only=True)
    sidecar["replay"]["groups"] = sidecar["replay"]["groups"][:-1]
    sidecar["replay"]["digest"] = digest.sha256_hex(sidecar["replay"]["groups"])
    torch.save(sidecar, step / layout.REPLAY_METADATA)
    manifest = json.loads((step / layout.MANIFEST).read_text())
    manifest["files"][layout.REPLAY_METADATA] = files.hash_file(step / layout.REPLAY_METADATA).to_dict()
    (step / layout.MANIFEST).write_text(json.dumps(manifest, indent=2))


CORRUPTIONS: dict[str, tuple[Any, str, int]] = {
    # name: (damage step_2 (its path, the run dir), regex for the refusal, step selected instead)
    "truncated-storage-file": (
        lambda s, r: (lambda f: f.write_bytes(f.read_bytes()[:-100]))(next(s.glob("data_plane/simple_storage/su_0_*"))),
        r"step_2/data_plane/simple_storage/su_0_TQ_STORAGE_UNIT_\w+\.pkl: "
        r"truncated \(\d+ bytes, the manifest says \d+\)",
        1,
    ),
    "flipped-byte": (
        lambda s, r: _flip(next(s.glob("data_plane/simple_storage/su_1_*"))),
        r"step_2/data_plane/simple_storage/su_1_TQ_STORAGE_UNIT_\w+\.pkl: checksum mismatch",
        1,
    ),
    "missing-data-plane": (
        lambda s, r: shutil.rmtree(s / "data_plane"),
        r"step_2/data_plane/\S+: missing \(listed in the manifest\)",
        1,
    ),
    "sidecar-digest-mismatch": (
        lambda s, r: _forge_sidecar(s),
        r"step_2/replay_buffer_metadata\.pt: digest \w+ does not match the manifest's \w+",
        1,
    ),
    "leftover-tmp-step": (
        lambda s, r: shutil.copytree(s, r / "tmp_step_3"),
        r"tmp_step_3: incomplete save \(tmp_ directory never renamed\)",
        2,
    ),
    "manifest-missing": (
        lambda s, r: (s / layout.MANIFEST).unlink(),
        r"step_2/manifest\.json: missing \(the save never completed\)",
        1,
    ),
    "manifest-invalid-json": (
        lambda s, r: (s / layout.MANIFEST).write_text('{"format_version": 1, "step": 2,'),
        r"step_2/manifest\.json: not valid JSON",
        1,
    ),
}


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_a_damaged_checkpoint_is_refused_naming_the_file_and_selection_falls_back(
    template: Path, tmp_path: Path, case: str
) -> None:
    damage, refusal, fallback = CORRUPTIONS[case]
    shutil.copytree(template, tmp_path, dirs_exist_ok=True)
    run_dir = tmp_path / RUN
    damage(run_dir / "step_2", run_dir)

    chosen = checkpointer.select(tmp_path, RUN, config=MATRIX, storage_units=2)
    assert chosen is not None and chosen.manifest.step == fallback
    reasons = [f"{p}: {why}" if p.name.startswith("tmp_") else why for p, why in chosen.skipped]
    assert any(re.search(refusal, r) for r in reasons), reasons
    if fallback == 1:  # the damaged step itself, pinned, is refused outright
        with pytest.raises((CheckpointCorrupt, DigestError), match=refusal):
            checkpointer.select(tmp_path, RUN, config=MATRIX, storage_units=2, step=2)


def test_checkpoints_exist_but_none_is_valid_is_an_error_not_a_fresh_start(template: Path, tmp_path: Path) -> None:
    shutil.copytree(template, tmp_path, dirs_exist_ok=True)
    for step in ("step_1", "step_2"):
        (tmp_path / RUN / step / layout.MANIFEST).unlink()
    with pytest.raises(CheckpointCorrupt, match="no valid checkpoint among 2"):
        checkpointer.select(tmp_path, RUN, config=MATRIX)
    assert checkpointer.select(tmp_path, "another-run", config=MATRIX) is None


# -- crash consistency --------------------------------------------------------------------------------


def test_sigkill_between_any_two_save_steps_leaves_the_new_checkpoint_or_the_previous(
    plane: Plane, tmp_path: Path
) -> None:
    token_file = tmp_path / "token.pkl"
    token_file.write_bytes(pickle.dumps(plane.token))
    gcs = ray.get_runtime_context().gcs_address
    completes = {"renamed", "parent_synced", "old_removed"}
    # Savers fork from one server that imported torch, Ray and TransferQueue once (before any thread or
    # Ray connection exists); each then attaches to this module's Ray and TransferQueue on its own.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(
        ["torch", "ray", "transfer_queue", "trainingrun_runtime.dataplane.checkpointer", "test_checkpointer"]
    )
    for i, stage in enumerate(SAVE_STAGES):
        root = tmp_path / stage
        partition = f"crash{i}"
        saver = ctx.Process(target=child_crash, args=(gcs, str(token_file), str(root), partition, stage))
        saver.start()
        saver.join(120)
        assert saver.exitcode == -signal.SIGKILL, (stage, saver.exitcode)
        chosen = checkpointer.select(root, RUN, config=ReplayConfig(partition, 2, 8), storage_units=2)
        assert chosen is not None
        run_dir = root / RUN
        if stage in completes:
            assert chosen.manifest.step == 2, stage
            assert chosen.replay_state["groups"][-1]["group_id"] == "g2"
        else:
            assert chosen.manifest.step == 1, stage
            assert not (run_dir / "step_2").exists(), stage
        commit.recover(run_dir)  # what the next save's begin() does
        assert sorted(p.name for p in run_dir.iterdir()) == (["step_1", "step_2"] if stage in completes else ["step_1"])


def child_crash(gcs: str, token_file: str, root: str, partition: str, kill_at: str) -> None:
    """Runs in a forked saver attached to the test's TransferQueue: save step 1, then step 2 killed at `kill_at`."""
    ray.init(address=gcs, log_to_driver=False)
    client = ConnectOnlyDataPlane.connect(pickle.loads(Path(token_file).read_bytes()))

    def on_stage(name: str) -> None:
        if armed and name == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    armed = False

    async def main() -> None:
        nonlocal armed
        buffer, barrier = new_buffer(client, ReplayConfig(partition, 2, 8))
        saver = DataPlaneCheckpointer(root, RUN, dataplane=client, buffer=buffer, barrier=barrier, on_stage=on_stage)
        await add_groups(buffer, range(2))
        await saving.save(saver, 1, attempt=1, config_hash="cfg")
        await add_groups(buffer, range(2, 3))
        armed = True
        await saving.save(saver, 2, attempt=1, config_hash="cfg")

    asyncio.run(main())
