"""The trainer: a saved and reloaded trainer continues bit-identically; the weights checksum is canonical."""

from __future__ import annotations

import enum
import io
import os
import pickle
import pickletools
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader

from trainingrun_runtime import config
from trainingrun_runtime.errors import CheckpointCorrupt
from trainingrun_runtime.grpo import group_sampling, objective, sharding, trainer, workload
from trainingrun_runtime.storage import files

CFG = config.TrainerConfig(prompts_per_step=3, grpo=config.GRPOConfig(group_size=4, kl_coef=0.1, updates_per_batch=2))


def _train(tr: trainer.Trainer, steps: range) -> None:
    work = workload.Workload(CFG)
    for s in steps:
        groups = [group_sampling.sample_group(tr.model, work, u, uid=u, version=s) for u in range(s * 3, s * 3 + 3)]
        adv = objective.group_advantages(torch.stack([g.rewards for g in groups]), 1e-4).flatten()
        tr.train_step(torch.cat([g.tokens for g in groups]), torch.cat([g.logprobs for g in groups]), adv)


def test_a_reloaded_trainer_ends_bit_identical_to_an_uninterrupted_one(tmp_path: Path) -> None:
    trainer.deterministic()
    straight = trainer.Trainer(CFG)
    _train(straight, range(4))

    first = trainer.Trainer(CFG)
    _train(first, range(2))
    saved_sha = first.save(tmp_path / "policy")
    second = trainer.Trainer(CFG)
    assert second.load(tmp_path / "policy") == saved_sha
    assert second.version == 2
    _train(second, range(2, 4))

    assert second.weights_sha256() == straight.weights_sha256()
    assert second.version == straight.version == 4


def test_the_policy_is_saved_in_dcp_form_keyed_by_parameter_name_so_any_number_of_ranks_can_load_it(
    tmp_path: Path,
) -> None:
    tr = trainer.Trainer(CFG)
    _train(tr, range(1))
    tr.save(tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {sharding.METADATA_FILE, sharding.shard_file(0), trainer.STATE_FILE}
    keys = set(FileSystemReader(tmp_path).read_metadata().state_dict_metadata)
    name = next(iter(tr.model.state_dict()))
    assert {f"model.{name}", f"optimizer.state.{name}.exp_avg", f"optimizer.state.{name}.exp_avg_sq"} <= keys


def test_a_checkpoint_of_an_earlier_version_in_one_file_per_state_still_loads(tmp_path: Path) -> None:
    tr = trainer.Trainer(CFG)
    _train(tr, range(1))
    torch.save(tr.model.state_dict(), tmp_path / trainer.MODEL_FILE)
    torch.save(tr.optimizer.state_dict(), tmp_path / trainer.OPTIMIZER_FILE)
    (tmp_path / trainer.STATE_FILE).write_text('{"version": 1}')
    expected = {p.name: files.hash_file(p) for p in tmp_path.iterdir()}
    again = trainer.Trainer(CFG)
    assert again.load(tmp_path, expected) == tr.weights_sha256()
    _train(again, range(1, 2))
    _train(tr, range(1, 2))
    assert again.weights_sha256() == tr.weights_sha256()


def test_the_weights_checksum_sees_one_flipped_bit_and_ignores_dict_order() -> None:
    state = {"b": torch.zeros(2), "a": torch.ones(3)}
    reordered = {"a": torch.ones(3), "b": torch.zeros(2)}
    assert trainer.weights_sha256(state) == trainer.weights_sha256(reordered)
    flipped = {"a": torch.ones(3), "b": torch.tensor([0.0, -0.0])}
    assert trainer.weights_sha256(state) != trainer.weights_sha256(flipped)


@pytest.mark.parametrize("name", [sharding.METADATA_FILE, sharding.shard_file(0), trainer.STATE_FILE])
def test_a_policy_file_that_differs_from_the_manifests_entry_is_refused_rather_than_loaded(
    tmp_path: Path, name: str
) -> None:
    """With the manifest's entries, the trainer checks each file through the descriptor it loads it from: a file
    replaced after the driver's verification (here: another trainer's) is refused, naming the file."""
    tr = trainer.Trainer(CFG)
    tr.save(tmp_path / "policy")
    expected = {p.name: files.hash_file(p) for p in (tmp_path / "policy").iterdir()}
    _train(tr, range(1))
    tr.save(tmp_path / "other")
    os.replace(tmp_path / "other" / name, tmp_path / "policy" / name)
    fresh = trainer.Trainer(CFG)
    with pytest.raises(CheckpointCorrupt, match=rf"policy/{name}: (checksum mismatch|\d+ bytes)"):
        fresh.load(tmp_path / "policy", expected)
    assert fresh.version == 0


def test_a_policy_loaded_with_the_manifests_entries_is_the_one_saved(tmp_path: Path) -> None:
    tr = trainer.Trainer(CFG)
    _train(tr, range(1))
    sha = tr.save(tmp_path)
    expected = {p.name: files.hash_file(p) for p in tmp_path.iterdir()}
    assert trainer.Trainer(CFG).load(tmp_path, expected) == sha


def test_a_background_save_holds_the_state_of_when_it_began_while_training_goes_on(tmp_path: Path) -> None:
    """`begin_save` copies the state into host memory and returns; the write goes on while the next step trains
    and changes every weight. What lands on disk, and the checksum read back from it, are the state at the save."""
    tr = trainer.Trainer(CFG)
    _train(tr, range(1))
    at_save = tr.weights_sha256()
    pending = tr.begin_save(tmp_path)
    _train(tr, range(1, 2))
    assert tr.weights_sha256() != at_save
    assert pending.finish() == at_save
    again = trainer.Trainer(CFG)
    assert again.load(tmp_path) == at_save
    assert again.version == 1
    _train(again, range(1, 2))
    assert again.weights_sha256() == tr.weights_sha256()  # the optimizer state was the save's too


def test_every_background_save_writes_the_state_of_its_own_moment_though_the_host_copy_is_reused(
    tmp_path: Path,
) -> None:
    """The host copy's buffers are kept from one save to the next (only the values are copied in again); a save
    before the optimizer has any state, and each later one, still holds exactly the state at its own moment."""
    tr = trainer.Trainer(CFG)
    for n in range(4):
        at_save = tr.weights_sha256()
        pending = tr.begin_save(tmp_path / str(n))
        _train(tr, range(n, n + 1))
        assert pending.finish() == at_save
        again = trainer.Trainer(CFG)
        assert again.load(tmp_path / str(n)) == at_save
        _train(again, range(n, n + 1))
        assert again.weights_sha256() == tr.weights_sha256(), f"save {n}: the optimizer state was not its own"


class _Payload:
    """Unpickling this runs `os.system` (were it allowed): what a crafted checkpoint would hide in DCP's metadata."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch pwned",))


def test_dcp_metadata_that_names_anything_but_dcps_own_classes_is_refused_before_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DCP's `.metadata` is a pickle. A writer who replaced it and the manifest (so that its checksum matches) still
    cannot run code in the trainer: the unpickler resolves only the classes DCP's metadata holds."""
    monkeypatch.chdir(tmp_path)
    tr = trainer.Trainer(CFG)
    tr.save(tmp_path / "policy")
    (tmp_path / "policy" / sharding.METADATA_FILE).write_bytes(pickle.dumps(_Payload()))
    expected = {p.name: files.hash_file(p) for p in (tmp_path / "policy").iterdir()}
    with pytest.raises(CheckpointCorrupt, match=r"\.metadata: refers to posix\.system"):
        trainer.Trainer(CFG).load(tmp_path / "policy", expected)
    assert not (tmp_path / "pwned").exists()


def test_a_saved_policys_metadata_refers_only_to_the_allowed_classes(tmp_path: Path) -> None:
    tr = trainer.Trainer(CFG)
    _train(tr, range(1))
    tr.save(tmp_path)
    named = set()
    for op, arg, _ in pickletools.genops((tmp_path / sharding.METADATA_FILE).read_bytes()):
        if op.name == "GLOBAL":
            named.add(tuple(str(arg).split(" ", 1)))
    found = _stack_globals((tmp_path / sharding.METADATA_FILE).read_bytes())
    assert found, "the metadata names classes"
    dtypes = {("torch", n) for n in dir(torch) if isinstance(getattr(torch, n), torch.dtype)}
    assert found | named <= sharding.METADATA_GLOBALS | dtypes, sorted(found - sharding.METADATA_GLOBALS - dtypes)


def _stack_globals(data: bytes) -> set[tuple[str, str]]:
    """The (module, name) pairs a protocol-4+ pickle looks up, read the way the unpickler reads them."""
    found: set[tuple[str, str]] = set()

    class Recorder(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> object:
            found.add((module, name))
            return super().find_class(module, name)

    Recorder(io.BytesIO(data)).load()
    return found


class _AsDebians311:
    """Pickles as Debian's Python 3.11.2 (the runtime image's) does: an enum member as `getattr(cls, name)`."""

    class Pickler(pickle.Pickler):
        def reducer_override(self, obj: object) -> object:
            if isinstance(obj, enum.Enum):
                return getattr, (type(obj), obj.name)
            return NotImplemented

    @classmethod
    def dumps(cls, obj: object) -> bytes:
        out = io.BytesIO()
        cls.Pickler(out).dump(obj)
        return out.getvalue()


def test_dcp_metadata_whose_enum_members_are_pickled_as_getattr_loads_as_in_the_runtime_image(tmp_path: Path) -> None:
    tr = trainer.Trainer(CFG)
    _train(tr, range(1))
    sha = tr.save(tmp_path)
    metadata = tmp_path / sharding.METADATA_FILE
    with metadata.open("rb") as f:
        written = pickle.load(f)
    metadata.write_bytes(_AsDebians311.dumps(written))
    assert ("builtins", "getattr") in _stack_globals(metadata.read_bytes())
    expected = {p.name: files.hash_file(p) for p in tmp_path.iterdir()}
    assert trainer.Trainer(CFG).load(tmp_path, expected) == sha


class _GetattrChain:
    """The first link of the chain a crafted pickle would use to reach any global: `getattr(<an allowed class>,
    "__init__")`, then its `__globals__`."""

    def __reduce__(self) -> tuple[object, tuple[object, str]]:
        from torch.distributed.checkpoint.metadata import Metadata

        return (getattr, (Metadata, "__init__"))


def test_dcp_metadata_that_uses_getattr_for_anything_but_an_enum_member_is_refused(tmp_path: Path) -> None:
    tr = trainer.Trainer(CFG)
    tr.save(tmp_path)
    (tmp_path / sharding.METADATA_FILE).write_bytes(pickle.dumps(_GetattrChain()))
    expected = {p.name: files.hash_file(p) for p in tmp_path.iterdir()}
    with pytest.raises(CheckpointCorrupt, match=r"\.metadata: calls getattr\(Metadata, '__init__'\)"):
        trainer.Trainer(CFG).load(tmp_path, expected)
