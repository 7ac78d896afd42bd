"""The samplers, and the loader, ledger and sampler together across simulated crashes and restores."""

from __future__ import annotations

import copy
import random

import pytest

from trainingrun_runtime.rollout import ledger, prompt_loader, samplers


def test_the_in_order_sampler_takes_exactly_the_steps_uids_at_its_version() -> None:
    s = samplers.InOrderSampler(prompts_per_step=2)
    assert s.loader_limit() == 2
    assert s.dispatch_version(1, current_version=0) == 0
    assert s.dispatch_version(2, current_version=0) is None  # waits for version 1
    assert s.select({0: 0}) is None
    assert s.select({0: 0, 1: 0, 2: 1}) == samplers.Selection(train=(0, 1))
    s.advance()
    assert s.loader_limit() == 4
    with pytest.raises(ValueError, match="other versions"):
        s.select({2: 0, 3: 1})


def test_the_async_sampler_drops_groups_staler_than_the_window_and_takes_the_oldest_fresh_ones() -> None:
    s = samplers.AsyncSampler(prompts_per_step=2, max_staleness=1)
    for _ in range(3):
        s.advance()
    assert s.loader_limit() == (3 + 1 + 1) * 2
    assert s.dispatch_version(99, current_version=3) == 3
    picked = s.select({0: 1, 5: 2, 4: 3, 9: 3})
    assert picked == samplers.Selection(train=(4, 5), drop=(0,))
    assert s.select({0: 1, 4: 3}) == samplers.Selection(train=(), drop=(0,))
    assert s.select({4: 3}) is None


def test_sampler_state_refuses_another_kind() -> None:
    with pytest.raises(ValueError, match="in_order"):
        samplers.AsyncSampler(2, 1).load_state_dict(samplers.InOrderSampler(2).state_dict())


class _Sim:
    """The controller's bookkeeping protocol without Ray or TransferQueue: the committed dict stands in for the
    replay index plus its rows, and `snapshot` is the checkpoint's barrier cut (taken between two loop turns)."""

    def __init__(self, smp: samplers.Sampler) -> None:
        self.loader = prompt_loader.PromptLoader(50, 0)
        self.book = ledger.Ledger()
        self.smp = smp
        self.committed: dict[int, int] = {}
        self.inflight: dict[int, int] = {}
        self.version = 0
        self.trained: list[int] = []

    def dispatch_one(self) -> bool:
        queued = self.book.queued()
        if not queued and self.loader.next_uid < self.smp.loader_limit():
            p = self.loader.next()
            self.book.left_loader(p.uid, p.index)
            queued = [p.uid]
        for uid in queued:
            v = self.smp.dispatch_version(uid, self.version)
            if v is not None:
                self.book.dispatched(uid)
                self.inflight[uid] = v
                return True
        return False

    def commit_one(self, rng: random.Random) -> bool:
        if not self.inflight:
            return False
        uid = rng.choice(sorted(self.inflight))
        self.committed[uid] = self.inflight.pop(uid)
        self.book.committed(uid, self.committed[uid])
        return True

    def train_one(self) -> bool:
        sel = self.smp.select(self.committed)
        if sel is None:
            return False
        for uid in sel.drop:
            del self.committed[uid]
            self.book.dropped(uid)
        if not sel.train:
            return True
        for uid in sel.train:
            del self.committed[uid]
        self.book.consumed(sel.train, self.smp.step)
        self.trained.extend(sel.train)
        self.smp.advance()
        self.version += 1
        return True

    def snapshot(self) -> dict[str, object]:
        return copy.deepcopy(
            {
                "loader": self.loader.state_dict(),
                "sampler": self.smp.state_dict(),
                "index": dict(self.committed),
                "ledger": self.book.state_dict(),
                "version": self.version,
                "trained": list(self.trained),
            }
        )

    def restore(self, snap: dict[str, object]) -> None:
        self.loader.load_state_dict(snap["loader"])  # type: ignore[arg-type]
        self.smp.load_state_dict(snap["sampler"])  # type: ignore[arg-type]
        self.committed = dict(snap["index"])  # type: ignore[call-overload]
        self.book.load_state_dict(snap["ledger"])  # type: ignore[arg-type]
        self.version = snap["version"]  # type: ignore[assignment]
        self.trained = list(snap["trained"])  # type: ignore[call-overload]
        self.inflight = {}

    def run(self, rng: random.Random, steps: int, crash_every: int | None = None) -> list[int]:
        snap = self.snapshot()
        turns = 0
        while self.smp.step < steps:
            choice = rng.randrange(3)
            if choice == 0:
                self.dispatch_one()
            elif choice == 1:
                self.commit_one(rng)
            else:
                self.train_one()
            turns += 1
            if turns % 7 == 0:
                snap = self.snapshot()
            if crash_every and turns % crash_every == 0:
                self.restore(snap)
        return self.trained


@pytest.mark.parametrize("kind", ["in_order", "async"])
@pytest.mark.parametrize("seed", range(5))
def test_crashes_between_any_two_turns_lose_no_committed_group_and_train_no_prompt_twice(kind: str, seed: int) -> None:
    def make() -> samplers.Sampler:
        return samplers.InOrderSampler(3) if kind == "in_order" else samplers.AsyncSampler(3, 1)

    crashed = _Sim(make())
    trained = crashed.run(random.Random(seed), steps=12, crash_every=11)
    assert sorted(trained) == sorted(set(trained)), "a prompt was trained twice"
    consumed = crashed.book.in_state(ledger.State.CONSUMED)
    assert sorted(trained) == consumed
    crashed.book.check_served(crashed.loader.next_uid)
    if kind == "in_order":
        assert trained == list(range(36))
        assert trained == _Sim(make()).run(random.Random(seed + 100), steps=12)
    else:
        assert len(trained) == 36
