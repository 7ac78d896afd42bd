"""TransferQueue's controller with a checkpoint save that pickles its state as it is, without deep copies first.

TransferQueue 0.1.11's `TransferQueueController.save_checkpoint` builds its state from `to_snapshot()` of every
partition (a `copy.deepcopy` of each attribute: the key maps, the per-row custom metadata, the field metadata)
and a deep copy of the index manager's sets, then pickles that. The copies cost several times the pickling
itself (`save_tq_controller_s` in `bench/bench_dataplane.py`), grow with the rows, and run inside the barrier's
window, on every checkpoint.

They buy nothing here: the save runs on the controller's one request thread, which serves every data
request too, so nothing it handles can change the state between the copy and the pickle; and the copy
walks the same live objects the pickle would, so a Ray method mutating them from another thread would
break either one alike (none does: the checkpointer's barrier window stops our writers, and reads go
through `get_partition_snapshot`, which copies for itself). `DirectPickleController.save_checkpoint`
therefore pickles the same dict of the same objects: the same file, which TransferQueue's own
`load_checkpoint` reads (and older bundles' files load the same way).

It also unpickles one tensor when it starts, so a restore does not wait for torch's serialization imports.

Its `load_checkpoint` reads the file through `unpickling.load_controller_state` (only the globals a controller
state holds), not the stock loader's plain `pickle.load`: the driver checks the same file before the load
(`snapshot.check_dir`), and this closes the window between that check and the load (a file swapped in between).

Who uses it: `storage_unit.install()` makes `tq.init` create this class (under TransferQueue's name and
namespace) instead of the stock one. Relies on 0.1.11's controller attributes (`controller_id`,
`partitions`, `index_manager`, `sampler`), checked with the version pin in `storage_unit.check_version`;
`tests/integration/test_dataplane.py` checks that the file unpickles to what the stock save writes.
"""

from __future__ import annotations

import logging
import pickle
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from trainingrun_runtime.dataplane import unpickling
from trainingrun_runtime.dataplane.tq_modules import tq_controller
from trainingrun_runtime.storage.manifest import FileEntry

__all__ = ["DirectPickleController", "state_of"]

log = logging.getLogger(__name__)


def state_of(controller: Any) -> dict[str, Any]:
    """The controller's checkpoint state, laid out as 0.1.11's `save_checkpoint` lays it out, of the live objects."""
    im = controller.index_manager
    return {
        "controller_id": controller.controller_id,
        "partitions": dict(controller.partitions),
        "index_manager": {
            "partition_to_indexes": dict(im.partition_to_indexes),
            "reusable_indexes": list(im.reusable_indexes),
            "global_index_counter": im.global_index_counter,
            "allocated_indexes": set(im.allocated_indexes),
        },
        "sampler": controller.sampler.save_checkpoint(),
    }


class DirectPickleController(tq_controller.TransferQueueController.__ray_actor_class__):  # type: ignore[misc]
    """A stock TransferQueue controller whose checkpoint save pickles its state without deep-copying it first."""

    expected_state: FileEntry | None = None
    """The manifest's entry of `controller_state.pkl`, set by the bootstrap client right before a restore:
    `load_checkpoint` unpickles the bytes read through the descriptor it checked against it. None: unchecked."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The first tensor this process unpickles (a restore's: the partitions' status tensors) imports torch's
        # serialization modules, which the restore would wait for; unpickle one now, at start-up.
        pickle.loads(pickle.dumps(torch.zeros(1)))

    def save_checkpoint(self, path: str) -> None:
        """Pickle the controller's state to `path` (the stock file, see the module docstring)."""
        try:
            with open(path, "wb") as f:
                pickle.dump(state_of(self), f, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            raise RuntimeError(f"[{self.controller_id}]: save checkpoint failed: {e}") from e
        log.debug("controller state saved to %s", path)

    def load_checkpoint(self, path: str) -> None:
        """Restore the state 0.1.11's `load_checkpoint` restores, unpickled with the restricted unpickler."""
        try:
            state = unpickling.load_controller_state(Path(path), self.expected_state)
            self.controller_id = state["controller_id"]
            self.partitions = state["partitions"]
            im = state["index_manager"]
            self.index_manager.partition_to_indexes = defaultdict(set, im["partition_to_indexes"])
            self.index_manager.reusable_indexes = im["reusable_indexes"]
            self.index_manager.global_index_counter = im["global_index_counter"]
            self.index_manager.allocated_indexes = im["allocated_indexes"]
            self.sampler.load_checkpoint(state["sampler"])
        except Exception as e:
            raise RuntimeError(f"[{self.controller_id}]: load checkpoint failed: {e}") from e
        log.info("[%s]: restored from %s", self.controller_id, path)
