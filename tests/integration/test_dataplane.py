"""The data-plane client against real local Ray and real TransferQueue 0.1.11.

One Ray cluster for the module; TransferQueue is restarted only where a test needs a pristine one
(`Planes` keeps the current one and says why it restarts). Tests run in file order to keep restarts
few, but each also works alone.
"""

from __future__ import annotations

import fractions
import json
import os
import pickle
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
import torch
import transfer_queue

from trainingrun_runtime.dataplane import row_client, snapshot, storage_unit, unpickling
from trainingrun_runtime.dataplane.lifecycle import (
    BootstrapDataPlane,
    ConnectOnlyDataPlane,
    DataPlaneToken,
)
from trainingrun_runtime.dataplane.replay_index import GroupRows
from trainingrun_runtime.dataplane.row_client import DataPlaneClient
from trainingrun_runtime.errors import CheckpointCorrupt, DataPlaneError, RestoreRefused
from trainingrun_runtime.storage import files, manifest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

UNITS = 1  # one storage unit keeps each TransferQueue start cheap; test_checkpointer.py restores across two


class Planes:
    """The module's TransferQueue: the current bootstrap client and, once decided, a connect-only client."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._snapshots: tuple[Path, Path] | None = None
        self.boot: BootstrapDataPlane | None = None
        self.client: ConnectOnlyDataPlane | None = None
        self.fresh_token: DataPlaneToken | None = None

    def restart(self) -> BootstrapDataPlane:
        self.close()
        self.boot = BootstrapDataPlane.start(storage_units=UNITS)
        return self.boot

    def pristine(self) -> BootstrapDataPlane:
        """An unused bootstrap client on an untouched TransferQueue."""
        if self.boot is None or self.boot._used_by is not None or not self.boot.state().pristine:
            return self.restart()
        return self.boot

    def live(self) -> tuple[BootstrapDataPlane, ConnectOnlyDataPlane]:
        """A TransferQueue started fresh, with a connect-only client built from its token."""
        if self.client is None:
            boot = self.pristine()
            self.fresh_token = boot.start_fresh()
            self.client = ConnectOnlyDataPlane.connect(self.fresh_token)
        assert self.boot is not None
        return self.boot, self.client

    def snapshots(self) -> tuple[Path, Path]:
        """Two snapshots of the same rows, the second with a truncated storage file (written once)."""
        if self._snapshots is None:
            _, client = self.live()
            client.put_groups("dirty", groups_of("d", 2, 2), {"x": torch.ones(4, 8)})
            good, bad = self.workdir / "good", self.workdir / "bad"
            snapshot_now(client, good, {"step": 1})
            snapshot_now(client, bad, {"step": 1})
            unit_file = next((bad / "simple_storage").glob("su_0_*.pkl"))
            unit_file.write_bytes(unit_file.read_bytes()[:-10])
            self._snapshots = (good, bad)
        return self._snapshots

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.boot is not None:
            self.boot.close()
        self.boot = self.client = None


@pytest.fixture(scope="module")
def planes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Planes]:
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    p = Planes(tmp_path_factory.mktemp("dataplane"))
    try:
        yield p
    finally:
        p.close()
        ray.shutdown()


@ray.remote(num_cpus=0)
class Intruder:
    """Another process using TransferQueue directly (not through our client)."""

    def write(self, partition: str) -> int:
        import torch as t
        import transfer_queue as tq
        from tensordict import TensorDict

        tq.init()  # attaches to the running controller
        tq.kv_batch_put(keys=["a", "b"], partition_id=partition, fields=TensorDict({"x": t.ones(2, 3)}, batch_size=2))
        return len(tq.kv_list(partition)[partition])


def snapshot_now(client: DataPlaneClient, directory: Path, metadata: dict[str, Any]) -> dict[str, int]:
    """A snapshot with every unit's digest in (what the bundle commit waits for); {relpath: size}."""
    pending = client.snapshot(directory, metadata)
    pending.digests()
    return dict(pending.sizes)


def tags_of(client: DataPlaneClient, partition: str, ids: list[str]) -> list[dict[str, Any]]:
    """The stored tags of rows, in the order asked for (from TransferQueue's metadata)."""
    state = client.inventory(partition)
    assert state is not None
    return [dict(state.rows[sid].tags) for sid in ids]


def groups_of(prefix: str, count: int, size: int) -> list[GroupRows]:
    return [GroupRows(f"{prefix}{g}", tuple(f"{prefix}{g}:{m}" for m in range(size))) for g in range(count)]


def rows_for(groups: list[GroupRows], seed: int = 0) -> dict[str, Any]:
    n = sum(len(g.sample_ids) for g in groups)
    gen = torch.Generator().manual_seed(seed)
    return {
        "tokens": torch.randint(0, 50_000, (n, 16), generator=gen),
        "reward": torch.rand(n, generator=gen),
        "response": [torch.arange(1 + (i % 4)) for i in range(n)],
        "text": [f"answer {i}" for i in range(n)],
    }


# -- order is structural -----------------------------------------------------------------------------


def test_a_connect_only_client_cannot_be_built_without_a_restore_token(planes: Planes) -> None:
    boot = planes.pristine()
    with pytest.raises(TypeError, match="connect\\(token\\)"):
        ConnectOnlyDataPlane()
    with pytest.raises(TypeError, match=r"issued only by BootstrapDataPlane\.load_checkpoint"):
        DataPlaneToken("0" * 32, "fresh", None)
    with pytest.raises(TypeError, match="needs the DataPlaneToken"):
        ConnectOnlyDataPlane.connect("restored")  # type: ignore[arg-type]
    with pytest.raises(DataPlaneError, match="must first restore \\(load_checkpoint\\) or start_fresh"):
        boot.list_sample_ids("train")
    assert boot._used_by is None and boot.state().pristine


def test_a_restore_after_another_clients_write_is_refused_naming_what_it_found(planes: Planes, tmp_path: Path) -> None:
    boot = planes.pristine()
    intruder = Intruder.remote()  # type: ignore[attr-defined]
    assert ray.get(intruder.write.remote("intruder"), timeout=120) == 2
    ray.kill(intruder)
    with pytest.raises(RestoreRefused) as refused:
        boot.load_checkpoint(tmp_path / "any")
    message = str(refused.value)
    assert "not pristine" in message and "partition 'intruder' holds 2 rows" in message
    assert "storage unit TransferQueueStorageUnit#" in message
    with pytest.raises(RestoreRefused, match="already used \\(load_checkpoint\\)"):
        boot.start_fresh()


# -- rows --------------------------------------------------------------------------------------------


def test_groups_are_put_read_back_overwritten_and_cleared(planes: Planes) -> None:
    _, client = planes.live()
    groups = groups_of("a", 3, 4)
    fields = rows_for(groups)
    client.put_groups("rows", groups, fields, tags=[{"prompt": i // 4} for i in range(12)])

    ids = ["a1:2", "a0:0", "a2:3"]
    got = client.read_rows("rows", ids)
    pos = [6, 0, 11]
    assert torch.equal(got["tokens"], fields["tokens"][pos])  # dense, not a jagged nested tensor
    assert torch.equal(got["reward"], fields["reward"][pos])
    assert isinstance(got["response"], list)
    assert [r.tolist() for r in got["response"]] == [fields["response"][i].tolist() for i in pos]
    assert got["text"] == [fields["text"][i] for i in pos]
    assert tags_of(client, "rows", ids)[0] == {"prompt": 1, "tr_group": "a1", "tr_group_size": 4}
    assert client.list_sample_ids("rows") == sorted(s for g in groups for s in g.sample_ids)

    advantages = torch.linspace(-1, 1, 4)
    client.update_fields("rows", list(groups[1].sample_ids), {"advantage": advantages})
    after = client.read_rows("rows", list(groups[1].sample_ids), fields=["advantage", "tokens"])
    assert torch.equal(after["advantage"], advantages)
    assert torch.equal(after["tokens"], fields["tokens"][4:8])
    assert client.list_sample_ids("rows") == sorted(s for g in groups for s in g.sample_ids)

    client.clear_groups("rows", [groups[0], groups[2]])
    assert client.list_sample_ids("rows") == list(groups[1].sample_ids)
    with pytest.raises(DataPlaneError, match="not stored in 'rows'"):
        client.read_rows("rows", ["a0:0"])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c, g: c.update_fields("whole", ["w0:0", "w0:1"], {"x": torch.ones(2)}), "partial: {'w0': '2 of 4'}"),
        (lambda c, g: c.clear_groups("whole", [GroupRows("w0", ("w0:0",))]), "partial: {'w0': '1 of 4'}"),
        (lambda c, g: c.clear_groups("whole", [GroupRows("w1", g[0].sample_ids)]), "belongs to group 'w0'"),
        (lambda c, g: c.put_groups("whole", [g[1]], rows_for([g[1]])), "already stored in 'whole'"),
        (
            lambda c, g: c.put_groups("whole", [GroupRows("n", ("n:0", "w0:0", "n:2", "n:3"))], rows_for([g[0]])),
            "already stored in 'whole': ['w0:0']",
        ),
        (
            lambda c, g: c.put_groups("whole", groups_of("z", 1, 2), rows_for(groups_of("z", 1, 2)), [{"tr_x": 1}] * 2),
            "reserved prefix",
        ),
        (lambda c, g: c.put_groups("whole", groups_of("y", 1, 2), {"x": torch.ones(3)}), "first dimension must be 2"),
    ],
    ids=[
        "partial-update",
        "partial-clear",
        "wrong-group",
        "duplicate-put",
        "partly-duplicate-put",
        "reserved-tag",
        "wrong-batch",
    ],
)
def test_puts_overwrites_and_clears_must_cover_whole_groups(planes: Planes, call: Any, message: str) -> None:
    _, client = planes.live()
    groups = groups_of("w", 2, 4)
    if not client.list_sample_ids("whole"):
        client.put_groups("whole", groups, rows_for(groups))
    before = client.inventory("whole")
    with pytest.raises(DataPlaneError, match=re.escape(message)):
        call(client, groups)
    assert client.inventory("whole") == before


class Unpicklable:
    def __reduce__(self) -> Any:
        raise RuntimeError("cannot be sent")


def test_a_failed_put_rolls_its_rows_back(planes: Planes) -> None:
    _, client = planes.live()
    kept = groups_of("k", 1, 2)
    client.put_groups("rollback", kept, {"x": torch.ones(2, 3)})
    before = client.inventory("rollback")
    doomed = groups_of("f", 2, 2)
    with pytest.raises(DataPlaneError, match="put_groups into 'rollback' failed and was rolled back"):
        client.put_groups("rollback", doomed, {"x": torch.ones(4, 3), "obj": [Unpicklable()] * 4})
    assert client.list_sample_ids("rollback") == ["k0:0", "k0:1"]
    assert client.inventory("rollback") == before
    client.put_groups("rollback", doomed, {"x": torch.ones(4, 3)})  # the ids are free again
    assert len(client.list_sample_ids("rollback")) == 6


def test_reused_global_indexes_never_mix_groups(planes: Planes) -> None:
    _, client = planes.live()
    first = groups_of("r", 2, 4)
    client.put_groups("reuse", first, {"v": torch.arange(8.0)})
    client.clear_groups("reuse", [first[0]])  # frees 4 global indexes; TQ hands them out again
    later = groups_of("s", 1, 4)
    client.put_groups("reuse", later, {"v": torch.arange(100.0, 104.0)})
    assert client.read_rows("reuse", list(first[1].sample_ids))["v"].tolist() == [4.0, 5.0, 6.0, 7.0]
    assert client.read_rows("reuse", list(later[0].sample_ids))["v"].tolist() == [100.0, 101.0, 102.0, 103.0]
    assert {t["tr_group"] for t in tags_of(client, "reuse", list(later[0].sample_ids))} == {"s0"}


# -- snapshot ----------------------------------------------------------------------------------------


def test_the_snapshot_stays_within_1_1x_the_live_rows_when_put_256_at_a_time(planes: Planes, tmp_path: Path) -> None:
    """Guards tq_storage_fix: stock 0.1.11 writes each row's whole put buffer, about 256x here."""
    _, client = planes.live()
    batches = [groups_of(f"b{b}-", 32, 8) for b in range(3)]  # 3 puts of 256 rows
    for b, groups in enumerate(batches):
        gen = torch.Generator().manual_seed(b)
        client.put_groups(
            "blowup",
            groups,
            {
                "tokens": torch.randint(0, 50_000, (256, 512), generator=gen),
                "logp": torch.randn(256, 512, generator=gen),
            },
        )
    client.clear_groups("blowup", batches[1][:16])  # live rows are not whole put messages any more
    live_rows = 3 * 256 - 16 * 8
    raw = live_rows * 512 * (8 + 4)

    files = snapshot_now(client, tmp_path / "data_plane", {"purpose": "size"})
    storage = sum(size for rel, size in files.items() if rel.startswith("simple_storage/su_"))
    total = sum(p.stat().st_size for p in (tmp_path / "data_plane").rglob("*") if p.is_file())
    assert storage <= 1.1 * raw, f"storage files {storage} bytes for {raw} raw bytes ({storage / raw:.1f}x)"
    assert total <= 1.1 * raw, f"snapshot {total} bytes for {raw} raw bytes ({total / raw:.2f}x)"
    client.clear_groups("blowup", [g for groups in batches for g in groups if g not in batches[1][:16]])


def test_a_row_value_the_checkpoint_cannot_hold_fails_the_snapshot_naming_the_field_and_type(
    planes: Planes, tmp_path: Path
) -> None:
    _, client = planes.live()
    groups = groups_of("sv", 1, 2)
    odd = [fractions.Fraction(1, 3), fractions.Fraction(2, 3)]  # reaches the unit as it is; no exact encoding
    client.put_groups("unstorable", groups, {"x": torch.ones(2, 2), "odd": odd})
    try:
        with pytest.raises(DataPlaneError, match=r"field 'odd', row \d+: a value of type fractions\.Fraction, "):
            client.snapshot(tmp_path / "dp", {"step": 1})
        assert not (tmp_path / "dp").exists()
    finally:
        client.clear_groups("unstorable", groups)


def test_the_snapshot_listing_lists_every_file(planes: Planes, tmp_path: Path) -> None:
    _, client = planes.live()
    client.put_groups("side", groups_of("q", 1, 2), {"x": torch.ones(2, 2)})
    files = snapshot_now(client, tmp_path / "dp", {"step": 7})
    listing = json.loads((tmp_path / "dp" / snapshot.LISTING).read_text())
    assert listing["files"] == files and listing["transferqueue"] == "0.1.11" and listing["storage_units"] == UNITS
    assert set(files) >= {"metadata.json", "controller_state.pkl", "simple_storage/storage_unit_info.json"}
    assert snapshot.check_dir(tmp_path / "dp", storage_units=UNITS)["files"] == files
    with pytest.raises(CheckpointCorrupt, match=f"snapshot has {UNITS} storage units, this TransferQueue 3"):
        snapshot.check_dir(tmp_path / "dp", storage_units=3)


def test_the_storage_units_hash_their_files_from_memory_and_leave_no_digest_files(
    planes: Planes, tmp_path: Path
) -> None:
    _, client = planes.live()
    client.put_groups("hashed", groups_of("h", 2, 4), {"x": torch.randn(8, 64), "s": [f"t{i}" for i in range(8)]})
    pending = client.snapshot(tmp_path / "dp", {"step": 1})
    digests = pending.digests()
    units = sorted(rel for rel in pending.sizes if rel.startswith("simple_storage/su_"))
    assert sorted(digests) == units and len(units) == UNITS
    for rel, digest in digests.items():
        assert files.hash_file(tmp_path / "dp" / rel) == manifest.FileEntry(size=pending.sizes[rel], digest=digest)
    assert not [p for p in (tmp_path / "dp").rglob("*.digest*")]
    snapshot.check_dir(tmp_path / "dp", storage_units=UNITS)
    client.clear_groups("hashed", groups_of("h", 2, 4))


def _plain(value: Any) -> Any:
    """A state unpickled from a controller file as plain comparable values (objects as their attributes)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, value.tolist())
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "__dict__"):
        return (type(value).__qualname__, _plain(vars(value)))
    return value


def test_the_controller_pickles_its_state_without_deep_copies_into_the_stock_file(
    planes: Planes, tmp_path: Path
) -> None:
    # Run inside the controller actor; nested, so Ray ships them by value (workers cannot import this module).
    def stock_save(controller: Any, path: str) -> None:  # 0.1.11's own save: deep copies, then the pickle
        from transfer_queue.controller import TransferQueueController

        TransferQueueController.__ray_actor_class__.save_checkpoint(controller, path)

    def is_ours(controller: Any) -> bool:
        from trainingrun_runtime.dataplane.tq_controller import DirectPickleController

        return isinstance(controller, DirectPickleController)

    _, client = planes.live()
    client.put_groups("ctl", groups_of("c", 3, 2), rows_for(groups_of("c", 3, 2)))
    controller = row_client.controller()
    assert ray.get(controller.__ray_call__.remote(is_ours))
    client.snapshot(tmp_path / "ours", {"step": 1}).digests()
    ray.get(controller.__ray_call__.remote(stock_save, str(tmp_path / "stock.pkl")))
    ours = pickle.loads((tmp_path / "ours" / "controller_state.pkl").read_bytes())
    stock = pickle.loads((tmp_path / "stock.pkl").read_bytes())
    assert "ctl" in ours["partitions"] and len(ours["index_manager"]["allocated_indexes"]) >= 6
    assert _plain(ours) == _plain(stock)
    client.clear_groups("ctl", groups_of("c", 3, 2))


def test_a_controller_save_that_cannot_write_names_the_controller_and_the_path(planes: Planes, tmp_path: Path) -> None:
    def save(controller: Any, path: str) -> None:  # inside the controller actor
        controller.save_checkpoint(path)

    planes.live()
    missing = tmp_path / "no-such-dir" / "controller_state.pkl"
    with pytest.raises(RuntimeError, match=rf"\]: save checkpoint failed: .*{re.escape(str(missing))}"):
        ray.get(row_client.controller().__ray_call__.remote(save, str(missing)))
    assert not missing.parent.exists()


def test_a_controller_state_saved_without_deep_copies_restores_the_same_state_rows_and_tags(
    planes: Planes, tmp_path: Path
) -> None:
    """TransferQueue's own load reads what `DirectPickleController` saved, into a fresh TransferQueue: the same
    controller state attribute by attribute (every partition, freed indexes included), the
    same rows and tags, and the index manager goes on where it was (a put after the restore overwrites nothing).
    The fresh controller unpickles its first tensor without importing anything (it did that when it started)."""

    # Run inside the controller actor; nested, so Ray ships them by value.
    def state(controller: Any) -> Any:  # read from the live controller, not through the code under test
        return {
            "controller_id": controller.controller_id,
            "partitions": controller.partitions,
            "index_manager": vars(controller.index_manager),
            "sampler": controller.sampler.save_checkpoint(),
        }

    def imports_of_an_unpickled_tensor(controller: Any) -> list[str]:
        import pickle
        import sys

        data = pickle.dumps(torch.zeros(2))
        before = set(sys.modules)
        pickle.loads(data)
        return sorted(set(sys.modules) - before)

    _, client = planes.live()
    groups = groups_of("m", 3, 4)
    client.put_groups("meta", groups, rows_for(groups, seed=3), tags=[{"prompt": i // 4} for i in range(12)])
    client.update_fields("meta", list(groups[1].sample_ids), {"advantage": torch.linspace(-1, 1, 4)})
    client.clear_groups("meta", [groups[0]])  # its global indexes go to the reusable list
    ids = [sid for g in groups[1:] for sid in g.sample_ids]
    rows_before, tags_before = client.read_rows("meta", ids), tags_of(client, "meta", ids)
    inventory_before = client.inventory("meta")
    saved = _plain(ray.get(row_client.controller().__ray_call__.remote(state)))
    assert saved["index_manager"]["reusable_indexes"] and "meta" in saved["partitions"]
    pending = client.snapshot(tmp_path / "dp", {"step": 1})
    pending.digests()
    assert set(pending.timings) == {"controller", "units", "files", "digest_wait"}

    boot = planes.restart()
    assert ray.get(row_client.controller().__ray_call__.remote(imports_of_an_unpickled_tensor)) == []
    assert _plain(ray.get(row_client.controller().__ray_call__.remote(state)))["partitions"] == {}
    token, _ = boot.load_checkpoint(tmp_path / "dp")
    assert _plain(ray.get(row_client.controller().__ray_call__.remote(state))) == saved
    phases = boot.load_timings
    assert set(phases) == {"pristine_check", "listing_check", "units", "controller", "total"}
    assert min(phases.values()) > 0
    assert (
        phases["pristine_check"] + phases["listing_check"] + max(phases["units"], phases["controller"])
        <= phases["total"]
    )
    restored = ConnectOnlyDataPlane.connect(token)
    try:
        assert restored.inventory("meta") == inventory_before
        assert tags_of(restored, "meta", ids) == tags_before
        assert _plain(restored.read_rows("meta", ids)) == _plain(rows_before)
        later = groups_of("n", 2, 4)
        restored.put_groups("meta", later, rows_for(later, seed=4))
        assert _plain(restored.read_rows("meta", ids)) == _plain(rows_before)
        later_ids = [sid for g in later for sid in g.sample_ids]
        assert [t["tr_group"] for t in tags_of(restored, "meta", later_ids)] == ["n0"] * 4 + ["n1"] * 4
    finally:
        restored.close()


def test_a_snapshot_in_the_old_format_is_refused_naming_the_file_and_the_fix(planes: Planes, tmp_path: Path) -> None:
    _, client = planes.live()
    snapshot_now(client, tmp_path / "dp", {"step": 1})
    side = tmp_path / "dp" / snapshot.LISTING
    listing = json.loads(side.read_text())
    side.write_text(json.dumps({**listing, "format": 1}))
    with pytest.raises(CheckpointCorrupt, match=rf"{re.escape(str(side))}: data-plane snapshot format 1, .* reads "
                       r"format 2 only .* restore it with the trainingrun version that wrote it"):  # fmt: skip
        snapshot.check_dir(tmp_path / "dp", storage_units=UNITS)


def test_a_controller_state_references_exactly_the_globals_the_restricted_unpickler_allows(
    planes: Planes, tmp_path: Path
) -> None:
    """What `unpickling.ALLOWED` is taken from: every global a real controller state names (partitions with
    tensors, text and ragged rows, tags, freed indexes), listed as the restricted unpickler resolves them."""
    found: set[tuple[str, str]] = set()

    class Listing(unpickling.ControllerUnpickler):
        def find_class(self, module: str, name: str) -> Any:
            found.add((module, name))
            return super().find_class(module, name)

    _, client = planes.live()
    groups = groups_of("gl", 3, 4)
    tags = [{"prompt": i // 4, "score": 0.5, "name": f"p{i}", "ok": True, "none": None} for i in range(12)]
    client.put_groups("globals", groups, rows_for(groups, seed=5), tags=tags)
    client.update_fields("globals", list(groups[1].sample_ids), {"advantage": torch.linspace(-1, 1, 4)})
    client.clear_groups("globals", [groups[0]])
    snapshot_now(client, tmp_path / "dp", {"step": 1})
    client.clear_groups("globals", groups[1:])
    with open(tmp_path / "dp" / "controller_state.pkl", "rb") as f:
        state = Listing(f, "listing").load()
    assert "globals" in state["partitions"] and state["index_manager"]["reusable_indexes"]
    assert {g for g in found if g[0] != "torch"} == unpickling.ALLOWED
    assert {name for module, name in found if module == "torch"} >= {"int64", "float32"}


def test_loading_through_a_client_that_was_already_used_is_refused(planes: Planes, tmp_path: Path) -> None:
    boot, client = planes.live()
    client.list_sample_ids("rows")
    with pytest.raises(RestoreRefused, match="already used \\(start_fresh\\)"):
        boot.load_checkpoint(tmp_path)
    assert not hasattr(client, "load_checkpoint")  # a connect-only client cannot restore at all
    planes.snapshots()  # written now, while this TransferQueue holds rows, for the tests below


def test_a_token_from_another_transferqueue_is_refused(planes: Planes) -> None:
    _, _ = planes.live()
    stale = pickle.loads(pickle.dumps(planes.fresh_token))
    planes.restart()
    with pytest.raises(DataPlaneError, match="not issued by the TransferQueue running in this Ray cluster"):
        ConnectOnlyDataPlane.connect(stale)


@pytest.mark.parametrize("damage", ["truncated-unit-file", "metadata-without-user-metadata"])
def test_a_failed_load_leaves_the_client_dirty(planes: Planes, tmp_path: Path, damage: str) -> None:
    good, bad = planes.snapshots()
    if damage == "truncated-unit-file":
        damaged = next((bad / "simple_storage").glob("su_0_*.pkl"))
        problem = "truncated"
    else:
        bad = shutil.copytree(good, tmp_path / "bad")
        damaged = bad / "metadata.json"
        damaged.write_text(damaged.read_text().replace('"user_metadata"', '"user_metadatX"'))  # same size
        problem = "unreadable"
    boot = planes.pristine()
    with pytest.raises(CheckpointCorrupt, match=f"{re.escape(str(damaged))}: {problem}"):
        boot.load_checkpoint(bad)
    assert boot.state().pristine  # refused before TransferQueue's loader saw anything
    with pytest.raises(RestoreRefused, match="already used \\(load_checkpoint\\)"):
        boot.load_checkpoint(good)


class _TouchMarker:
    """Unpickling this creates the marker file (through os.system): proof that a pickle ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_a_crafted_controller_state_is_refused_naming_the_global_before_transferqueue_loads_it(
    planes: Planes, tmp_path: Path
) -> None:
    good, _ = planes.snapshots()
    bad = shutil.copytree(good, tmp_path / "bad")
    marker = tmp_path / "ran"
    pickle.loads(pickle.dumps(_TouchMarker(marker)))  # proof that the payload creates the marker when unpickled
    assert marker.exists()
    marker.unlink()
    crafted = bad / "controller_state.pkl"
    payload = {"controller_id": _TouchMarker(marker), "partitions": {}, "index_manager": {}, "sampler": {}}
    crafted.write_bytes(pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL))
    side = bad / snapshot.LISTING
    listing = json.loads(side.read_text())
    listing["files"]["controller_state.pkl"] = crafted.stat().st_size  # a listing that agrees: only the pickle is bad
    side.write_text(json.dumps(listing))
    boot = planes.pristine()
    with pytest.raises(CheckpointCorrupt, match=rf"{re.escape(str(crafted))}: references posix\.system, "):
        boot.load_checkpoint(bad)
    assert boot.state().pristine  # refused before TransferQueue's loader saw anything
    assert not marker.exists()


def test_transferqueues_controller_itself_loads_its_state_only_through_the_restricted_unpickler(
    planes: Planes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file swapped in after the driver's check (here: the check skipped) still never runs code: the controller's
    own load refuses the global, in the controller's process."""
    good, _ = planes.snapshots()
    bad = shutil.copytree(good, tmp_path / "swapped")
    marker = tmp_path / "ran"
    crafted = bad / "controller_state.pkl"
    payload = {"controller_id": _TouchMarker(marker), "partitions": {}, "index_manager": {}, "sampler": {}}
    crafted.write_bytes(pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL))
    side = bad / snapshot.LISTING
    listing = json.loads(side.read_text())
    listing["files"]["controller_state.pkl"] = crafted.stat().st_size
    side.write_text(json.dumps(listing))
    monkeypatch.setattr(unpickling, "check_controller_state", lambda path, want=None: None)  # the swap after the check
    boot = planes.pristine()
    with pytest.raises(Exception, match=r"references posix\.system"):
        boot.load_checkpoint(bad)
    assert not marker.exists()


def test_restored_rows_outlive_their_deleted_snapshot_and_take_overwrites(planes: Planes, tmp_path: Path) -> None:
    good, _ = planes.snapshots()
    copy = tmp_path / "restored"
    shutil.copytree(good, copy)
    boot = planes.pristine()
    token, _ = boot.load_checkpoint(copy)
    client = ConnectOnlyDataPlane.connect(token)
    ids = [sid for g in groups_of("d", 2, 2) for sid in g.sample_ids]
    shutil.rmtree(copy)  # as retention does: the storage units' mappings keep the rows readable
    assert torch.equal(torch.stack(list(client.read_rows("dirty", ids, ["x"])["x"])), torch.ones(4, 8))
    client.update_fields("dirty", ids, {"x": torch.full((4, 8), 2.0)})  # the advantage stage's overwrite
    assert torch.equal(torch.stack(list(client.read_rows("dirty", ids, ["x"])["x"])), torch.full((4, 8), 2.0))
    client.close()


def test_a_token_for_a_transferqueue_that_no_bootstrap_client_started_is_refused_saying_so(planes: Planes) -> None:
    if planes.fresh_token is None:  # run alone
        planes.live()
    token = planes.fresh_token
    assert token is not None
    planes.close()
    transfer_queue.init({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}})  # stores no token nonce
    try:
        with pytest.raises(DataPlaneError, match=r"not issued by .*\(it was not started by a trainingrun bootstrap"):
            ConnectOnlyDataPlane.connect(token)
    finally:
        transfer_queue.close()
        deadline = time.monotonic() + 60
        while row_client.find_controller() is not None and time.monotonic() < deadline:
            time.sleep(0.2)


def test_start_fails_fast_when_ray_lacks_cpu_slots(planes: Planes) -> None:
    planes.close()
    started = time.monotonic()
    with pytest.raises(DataPlaneError, match="needs 9 free Ray CPU slots \\(1 controller \\+ 8 storage units\\)"):
        BootstrapDataPlane.start(storage_units=8)
    assert time.monotonic() - started < 10


def test_the_storage_fix_refuses_another_transferqueue_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transfer_queue, "__version__", "0.1.12")
    with pytest.raises(DataPlaneError, match=r"transferqueue 0\.1\.12 is installed but .* relies on 0\.1\.11"):
        storage_unit.install()
