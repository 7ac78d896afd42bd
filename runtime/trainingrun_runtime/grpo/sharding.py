"""Data-parallel trainer ranks: the process group, FSDP2 sharding, and the policy's checkpoint in
`torch.distributed.checkpoint` (DCP) form, read back only through checked files.

    N ranks (N = spec.trainer.trainerWorkers), one process each
    join(address, rank, N)       ─► torch.distributed group: gloo on the CPU, NCCL with a GPU (and gloo for host
                                    tensors); N = 1: no group
    shard(model)                 ─► fully_shard on every transformer block (the model's `_no_split_modules`), then
                                    the root; FSDP averages the ranks' gradients (gloo has no pre-scaled sum), so
                                    each rank's loss is N × its share of the whole batch's (`grpo.trainer`)
    save(dir, model, optimizer)  ─► dir/.metadata + __<rank>_0.distcp per rank: every rank writes its shard
    save_async(...)              ─► the same, but only the copy into host memory blocks (into buffers kept from
                                    the save before, in one batched copy); the write runs in a thread (its
                                    collectives on a gloo group of their own) while training goes on
    read_weights(dir)            ─► the whole weights from the files, in one process (the checkpoint's checksum)
    load(dir, model, optimizer, expected)
                                 ─► any number of ranks reads a checkpoint written by any other number (DCP
                                    reshards); each file is opened through `files.open_checked` against the
                                    manifest's entry, in the process that reads it; the `.metadata` (a pickle)
                                    through an unpickler that resolves only the classes DCP's metadata holds

The state is keyed by parameter names (`get_state_dict`), never by a rank's position in the optimizer, so the
same files load onto 1 rank or 8. Nothing here writes outside `dir`; fsync and the manifest are the commit's
(`storage.commit`), which runs only after every rank's `save` returned.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import enum
import io
import os
import pickle
import socket
import warnings
from collections.abc import Generator, Iterator, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import IO, Any, Final, cast

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import state_dict_loader, state_dict_saver
from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.tensor import DTensor
from torch.utils import _pytree as pytree

from trainingrun_runtime.errors import CheckpointCorrupt
from trainingrun_runtime.storage import files
from trainingrun_runtime.storage.manifest import FileEntry

__all__ = [
    "METADATA_FILE",
    "METADATA_GLOBALS",
    "full_weights",
    "join",
    "load",
    "read_weights",
    "rendezvous",
    "save",
    "save_async",
    "shard",
    "shard_file",
]

METADATA_FILE = ".metadata"
"""DCP's index of a checkpoint (written by rank 0); the shards are `shard_file(rank)`."""
JOIN_TIMEOUT = datetime.timedelta(minutes=10)
"""How long a collective waits for a rank that does not come (a lost rank ends the attempt before this)."""


def shard_file(rank: int) -> str:
    """The file DCP writes a rank's shard of the policy and optimizer into."""
    return f"__{rank}_0.distcp"


def rendezvous(ip: str) -> str:
    """`tcp://ip:port` with a port free on this node, for the other ranks to join rank 0 (called on rank 0)."""
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return f"tcp://{ip}:{port}"


_checkpoint_group: dist.ProcessGroup | None = None
"""A gloo group of the same ranks for the background writes' collectives (`save_async`): they run in another thread
while training's collectives run on the default group, and two threads must never share one group."""


class _KeptStager:
    """DCP's stager for `save_async`, keeping the host copy of the state from one save to the next.

    The first save (and any whose state has another shape: the optimizer's state appears after the first step) is
    staged by DCP's `DefaultStager`, a copy of every tensor into host memory. Every later one copies the values into
    those same buffers in one batched `torch._foreach_copy_`, rather than walking and copying tensor by tensor: for
    a small model that walk was most of what a save blocked. Safe because one save is in flight at a time
    (`driver.checkpoints` waits for the previous write before it stages the next)."""

    _synchronize_after_execute = False  # staging is done when `stage` returns

    def __init__(self) -> None:
        self._first = DefaultStager(StagingOptions(False, False, False, False))  # no pinning: CPU tensors here
        self._spec: pytree.TreeSpec | None = None
        self._kept: list[Any] = []

    @property
    def should_synchronize_after_execute(self) -> bool:
        return self._synchronize_after_execute

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        leaves, spec = pytree.tree_flatten(state_dict)
        if not self._fits(leaves, spec):
            staged = cast("dict[str, Any]", self._first.stage(state_dict))
            self._kept, self._spec = pytree.tree_flatten(staged)[0], spec
            return staged
        pairs = [(_local(kept), _local(live)) for kept, live in zip(self._kept, leaves, strict=True)
                 if isinstance(live, torch.Tensor)]  # fmt: skip
        with torch.no_grad():
            torch._foreach_copy_([kept for kept, _ in pairs], [live for _, live in pairs])
        fresh = [kept if isinstance(live, torch.Tensor) else copy.deepcopy(live)
                 for kept, live in zip(self._kept, leaves, strict=True)]  # fmt: skip
        return cast("dict[str, Any]", pytree.tree_unflatten(fresh, spec))

    def _fits(self, leaves: list[Any], spec: pytree.TreeSpec) -> bool:
        """Whether the kept copy has this state's structure, and a tensor of the same shape and type at each place."""
        if self._spec is None or spec != self._spec:
            return False
        for kept, live in zip(self._kept, leaves, strict=True):
            if isinstance(live, torch.Tensor) != isinstance(kept, torch.Tensor):
                return False
            if isinstance(live, torch.Tensor) and (
                type(live) is not type(kept)
                or _local(live).shape != _local(kept).shape
                or _local(live).dtype != _local(kept).dtype
            ):
                return False
        return True

    def synchronize_staging(self) -> None:
        """Nothing to wait for: `stage` copies before it returns."""

    def close(self) -> None:
        self._first.close()


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a sharded tensor (a DTensor's local shard), or the tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


_stager: _KeptStager | None = None
"""The host copy of this process's state for background saves (one save at a time: `driver.checkpoints`)."""


def join(address: str, rank: int, world: int) -> None:
    """Join the trainer ranks' process group (blocks until all `world` ranks have joined), and the checkpoint group
    beside it."""
    global _checkpoint_group
    # With GPUs, NCCL for the model's tensors and gloo for the few host tensors (a step's token count, its stats).
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, init_method=address, rank=rank, world_size=world, timeout=JOIN_TIMEOUT)
    group = dist.new_group(backend="gloo", timeout=JOIN_TIMEOUT)
    assert isinstance(group, dist.ProcessGroup)  # every rank is a member
    _checkpoint_group = group


def shard(model: Any) -> None:
    """FSDP2 over the process group: each transformer block, then the whole model (in place)."""
    from torch.distributed.fsdp import fully_shard

    blocks = set(getattr(model, "_no_split_modules", None) or ())
    for module in list(model.modules())[1:]:
        if type(module).__name__ in blocks:
            fully_shard(module)
    fully_shard(model)


def full_weights(model: Any) -> dict[str, torch.Tensor]:
    """Every rank calls this together; rank 0 gets the whole weights in host memory, the others `{}`."""
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: cast(torch.Tensor, v).detach().to("cpu", copy=True) for k, v in state.items()}


def save(directory: Path, model: Any, optimizer: torch.optim.Optimizer) -> None:
    """Every rank writes its shard of the weights and the optimizer state into `directory` (collective)."""
    weights, optim = get_state_dict(model, optimizer)
    writer = FileSystemWriter(directory, sync_files=False)  # the commit fsyncs every file of the bundle
    with _alone_is_meant():
        state_dict_saver.save({"model": weights, "optimizer": optim}, storage_writer=writer, no_dist=not _grouped())


def save_async(directory: Path, model: Any, optimizer: torch.optim.Optimizer) -> Future[None]:
    """`save`, with only the copy of this rank's state into host memory done now: the write runs in a thread of
    this process (its collectives on the checkpoint group) while the caller trains on. Wait for the returned
    future before the files are anything; the copy is what was there when this returned."""
    global _stager
    if _stager is None:  # kept: it keeps the host copy's buffers, so a save after the first allocates nothing
        _stager = _KeptStager()
    weights, optim = get_state_dict(model, optimizer)
    writer = FileSystemWriter(directory, sync_files=False)
    with _alone_is_meant():
        future = state_dict_saver.async_save(
            {"model": weights, "optimizer": optim},
            storage_writer=writer,
            process_group=_checkpoint_group,
            async_stager=_stager,
            no_dist=not _grouped(),
        )
    return cast("Future[None]", future)


def read_weights(directory: Path) -> dict[str, torch.Tensor]:
    """The whole weights as the files in `directory` hold them, gathered from every rank's shard in this one
    process (no collective): what a restore would load, on any number of ranks."""
    reader = _Reader(directory)
    meta = reader.read_metadata()
    weights: dict[str, torch.Tensor] = {}
    for key, item in meta.state_dict_metadata.items():
        if key.startswith("model.") and isinstance(item, TensorStorageMetadata):
            weights[key.removeprefix("model.")] = torch.empty(item.size, dtype=item.properties.dtype)
    with _alone_is_meant():
        state_dict_loader.load({"model": weights}, storage_reader=_Reader(directory), no_dist=True)
    return weights


def load(
    directory: Path, model: Any, optimizer: torch.optim.Optimizer | None, expected: Mapping[str, FileEntry] | None
) -> None:
    """Load what `save` wrote, by any number of ranks, into this rank's shards (collective); with `expected` (the
    manifest's entries of `policy/` by file name) every file is read through its checked descriptor. Without an
    optimizer only the weights are read (an export)."""
    if optimizer is None:
        state: dict[str, Any] = {"model": model.state_dict()}
    else:
        weights, optim = get_state_dict(model, optimizer)
        state = {"model": weights, "optimizer": optim}
    reader = _Reader(directory)
    checked = None if expected is None else _CheckedFiles(expected)
    if checked is not None:
        reader.fs = checked
    try:
        with _alone_is_meant():
            state_dict_loader.load(state, storage_reader=reader, no_dist=not _grouped())
    except BaseException as e:  # DCP gathers every rank's failure into one of its own: name the refused file
        refused = (checked.refused if checked is not None else None) or reader.refused
        if refused is not None:
            raise refused from e
        raise
    if optimizer is None:
        model.load_state_dict(state["model"])
    else:
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def _grouped() -> bool:
    return dist.is_available() and dist.is_initialized()


@contextlib.contextmanager
def _alone_is_meant() -> Iterator[None]:
    """Without a process group (one trainer worker, an export) DCP warns that it assumes one process: it is meant."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is .*single process", category=UserWarning)
        yield


METADATA_GLOBALS: Final[frozenset[tuple[str, str]]] = frozenset(
    {
        *(
            ("torch.distributed.checkpoint.metadata", name)
            for name in (
                "Metadata",
                "StorageMeta",
                "MetadataIndex",
                "TensorStorageMetadata",
                "BytesStorageMetadata",
                "ChunkStorageMetadata",
                "TensorProperties",
                "_MEM_FORMAT_ENCODING",
            )
        ),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),  # where an item sits in its shard file
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),  # a tensor's layout, by name (torch.strided)
        ("pathlib", "PosixPath"),
        ("pathlib", "PurePosixPath"),
    }
)
"""(module, name) pairs a DCP `.metadata` may reference, besides `torch.<dtype>`: what `save` writes (listed by
`tests/unit/runtime/grpo/test_trainer.py`)."""

_DTYPES: Final[frozenset[str]] = frozenset(n for n in dir(torch) if isinstance(getattr(torch, n), torch.dtype))


class _MetadataUnpickler(pickle.Unpickler):
    """DCP's `.metadata` is a pickle: this reads it resolving `METADATA_GLOBALS` and torch's dtypes only, so a
    crafted file naming anything else is refused (CheckpointCorrupt naming the global) before it is imported."""

    def __init__(self, file: IO[bytes], where: str) -> None:
        super().__init__(file)
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in METADATA_GLOBALS or (module == "torch" and name in _DTYPES):
            return super().find_class(module, name)
        if (module, name) == ("builtins", "getattr"):
            return self._enum_member  # some Pythons (Debian's 3.11.2) pickle an enum member as getattr(cls, name)
        raise CheckpointCorrupt(f"{self.where}: refers to {module}.{name}, which DCP's metadata never holds")

    def _enum_member(self, cls: Any, name: Any) -> Any:
        """`getattr` as an enum member's pickle uses it, and nothing more: a member of an allowed enum, by name."""
        allowed = (
            isinstance(cls, type) and issubclass(cls, enum.Enum) and (cls.__module__, cls.__name__) in METADATA_GLOBALS
        )
        if allowed and isinstance(name, str) and name in cls.__members__:
            return cls[name]
        raise CheckpointCorrupt(
            f"{self.where}: calls getattr({getattr(cls, '__name__', type(cls).__name__)}, {name!r}), which is not a "
            "member of an enum DCP's metadata holds"
        )


class _Reader(FileSystemReader):
    """DCP's file reader, its `.metadata` read by `_MetadataUnpickler` instead of a plain `pickle.load`."""

    refused: CheckpointCorrupt | None = None
    """The metadata refused in this process (DCP reports only its own wrapper of the error)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        try:
            with self.fs.create_stream(path, "rb") as f:
                metadata = _MetadataUnpickler(cast(IO[bytes], f), str(path)).load()
            if not isinstance(metadata, Metadata):
                raise CheckpointCorrupt(f"{path}: not DCP's metadata ({type(metadata).__name__})")
        except CheckpointCorrupt as e:
            self.refused = self.refused or e
            raise
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        assert metadata.storage_meta is not None
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _CheckedFiles(FileSystem):
    """DCP's file access for reading, each file through `files.open_checked` against the manifest's entry."""

    def __init__(self, expected: Mapping[str, FileEntry]) -> None:
        self.expected = dict(expected)
        self.refused: CheckpointCorrupt | None = None
        """The first file refused in this process (DCP reports only its own wrapper of the error)."""

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Generator[io.IOBase, None, None]:
        if mode != "rb":
            raise PermissionError(f"{path}: a checkpoint being restored is read, never written")
        name = Path(path).name
        try:
            if name not in self.expected:
                if not os.path.lexists(path):  # DCP looks for optional files (a rank's own metadata) this way
                    raise FileNotFoundError(path)
                raise CheckpointCorrupt(f"{path}: not in the manifest of this checkpoint")
            f = files.open_checked(path, self.expected[name])
        except CheckpointCorrupt as e:
            self.refused = self.refused or e
            raise
        with f:
            yield cast(io.IOBase, f)


def is_checkpoint(names: Iterator[str] | list[str] | set[str]) -> bool:
    """Whether a `policy/` listing is a DCP checkpoint (else the single-file format of earlier versions)."""
    return METADATA_FILE in set(names)
