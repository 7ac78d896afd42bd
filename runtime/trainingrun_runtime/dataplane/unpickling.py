"""A restricted unpickler for TransferQueue's `controller_state.pkl`: only the globals that state holds may load.

TransferQueue 0.1.11 pickles its controller's state (`tq_controller.DirectPickleController.save_checkpoint`, the
stock layout) and its `load_checkpoint` reads it back with a plain `pickle.load` inside the controller actor,
which would run whatever a crafted file names. `snapshot.load` therefore reads the file through
`ControllerUnpickler` first (`check_controller_state`, parse only: the result is discarded) and hands it to
TransferQueue's loader only if that succeeds. The unpickler resolves nothing but `ALLOWED` (the pairs a real
snapshot references, listed by `tests/integration/test_dataplane.py`) and torch's dtypes; anything else is
refused with a `CheckpointCorrupt` naming the file and the global, before it is imported or called.

One allowed global is replaced: a tensor's storage is pickled as `torch.storage._load_from_bytes(b)`, which
is `torch.load(b, weights_only=False)`, a second, unrestricted unpickler. Here those bytes go through
`torch.load(..., weights_only=True)` (torch's own allow-list) instead, so a payload hidden in them is refused too.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any, BinaryIO, Final

import torch

from trainingrun_runtime.errors import CheckpointCorrupt
from trainingrun_runtime.storage import files
from trainingrun_runtime.storage.manifest import FileEntry

__all__ = ["ALLOWED", "ControllerUnpickler", "check_controller_state", "load_controller_state"]

ALLOWED: Final[frozenset[tuple[str, str]]] = frozenset(
    {
        ("transfer_queue.controller", "DataPartitionStatus"),  # a partition (a dataclass: NEWOBJ, then BUILD)
        ("transfer_queue.controller", "FieldMeta"),  # a field's metadata (a dataclass)
        ("torch._utils", "_rebuild_tensor_v2"),  # a CPU tensor: status tensors of the partitions
        ("torch.storage", "_load_from_bytes"),  # its storage (replaced by `_storage_from_bytes`)
        ("collections", "OrderedDict"),  # a tensor's (empty) backward hooks
    }
)
"""(module, name) pairs a controller state may reference, besides `torch.<dtype>` (a field's dtype)."""

_DTYPES: Final[frozenset[str]] = frozenset(n for n in dir(torch) if isinstance(getattr(torch, n), torch.dtype))


def _storage_from_bytes(data: bytes) -> Any:
    """`torch.storage._load_from_bytes`, with torch's weights-only unpickler instead of an unrestricted one."""
    return torch.load(io.BytesIO(data), weights_only=True)


class ControllerUnpickler(pickle.Unpickler):
    """A `pickle.Unpickler` whose `find_class` resolves `ALLOWED` and torch dtypes only; `where` names the file."""

    def __init__(self, file: BinaryIO, where: str) -> None:
        super().__init__(file)
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch.storage", "_load_from_bytes"):
            return _storage_from_bytes
        if (module, name) in ALLOWED or (module == "torch" and name in _DTYPES):
            return super().find_class(module, name)
        raise CheckpointCorrupt(
            f"{self.where}: references {module}.{name}, which a TransferQueue controller state never holds "
            "(refused before anything ran; the file is not the one TransferQueue wrote)"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise CheckpointCorrupt(f"{self.where}: holds a persistent id, which a controller state never holds")


def load_controller_state(path: Path, want: FileEntry | None = None) -> Any:
    """The controller state in `path`, unpickled with `ControllerUnpickler`; CheckpointCorrupt naming the file.
    With `want` (the manifest's entry), unpickled from the descriptor its checksum was checked through."""
    where = str(path)
    try:
        with open(path, "rb") if want is None else files.open_checked(path, want) as f:
            return ControllerUnpickler(f, where).load()
    except CheckpointCorrupt:
        raise
    except Exception as e:  # a damaged pickle raises almost anything (UnpicklingError, EOFError, ValueError, ...)
        raise CheckpointCorrupt(f"{where}: unreadable controller state ({type(e).__name__}: {e})") from None


def check_controller_state(path: Path, want: FileEntry | None = None) -> None:
    """Refuse `path` (CheckpointCorrupt) unless it unpickles with `ControllerUnpickler` to a controller state
    (`want` as in `load_controller_state`)."""
    state = load_controller_state(path, want)
    if not isinstance(state, dict) or not {"controller_id", "partitions", "index_manager", "sampler"} <= set(state):
        raise CheckpointCorrupt(f"{path}: not a TransferQueue controller state (unexpected layout)")
