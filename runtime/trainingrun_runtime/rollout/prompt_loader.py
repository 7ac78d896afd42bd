"""The prompt loader: an endless, resumable stream of (uid, dataset index) pairs.

    uid 0, 1, 2, …  ─►  epoch = uid // N,  position = uid % N  ─►  index = shuffle(seed, epoch)[position]

A prompt's uid is its place in the stream; every uid leaves the loader once. The
whole loader state is the next uid (the "loader place"), saved as
`train_dataloader.pt` in each checkpoint and read inside the checkpoint's barrier
cut, so a resumed run hands out exactly the prompts the interrupted one had not.
Each epoch's permutation comes from `derive_seed(seed, "epoch", epoch)`. Pure
standard library; used by the controller's rollout pump.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from typing import TypedDict

from trainingrun_runtime.grpo import seeding

__all__ = ["LoaderState", "Prompt", "PromptLoader"]


@dataclasses.dataclass(frozen=True)
class Prompt:
    """One prompt leaving the loader: its stream uid and its dataset index."""

    uid: int
    index: int


class LoaderState(TypedDict):
    """`PromptLoader.state_dict()`: the loader place and what it was built for."""

    next_uid: int
    dataset_size: int
    seed: int


class PromptLoader:
    """Hands out prompts in a seeded per-epoch shuffle; `state_dict` is the next uid."""

    def __init__(self, dataset_size: int, seed: int) -> None:
        self._n = dataset_size
        self._seed = seed
        self._next_uid = 0

    @property
    def next_uid(self) -> int:
        """The uid the next `next()` returns; every smaller uid has left the loader."""
        return self._next_uid

    def index_of(self, uid: int) -> int:
        """The dataset index of stream position `uid` (for redispatching a uid that already left)."""
        epoch, position = divmod(uid, self._n)
        return _permutation(self._seed, epoch, self._n)[position]

    def next(self) -> Prompt:
        """The next prompt in the stream."""
        prompt = Prompt(uid=self._next_uid, index=self.index_of(self._next_uid))
        self._next_uid += 1
        return prompt

    def state_dict(self) -> LoaderState:
        """The loader place, plus the parameters it must be restored with."""
        return LoaderState(next_uid=self._next_uid, dataset_size=self._n, seed=self._seed)

    def load_state_dict(self, state: LoaderState) -> None:
        """Continue from a saved place; refuses a state saved for another dataset or seed."""
        if (state["dataset_size"], state["seed"]) != (self._n, self._seed):
            raise ValueError(
                f"loader state is for dataset_size={state['dataset_size']} seed={state['seed']}, "
                f"not {self._n}/{self._seed}"
            )
        self._next_uid = int(state["next_uid"])


@functools.lru_cache(maxsize=4)
def _permutation(seed: int, epoch: int, n: int) -> tuple[int, ...]:
    order = list(range(n))
    random.Random(seeding.derive_seed(seed, "epoch", epoch)).shuffle(order)
    return tuple(order)
