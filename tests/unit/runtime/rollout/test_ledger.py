"""The per-sample ledger: a prompt is trained at most once, and a restore queues in-flight prompts again."""

from __future__ import annotations

import json

import pytest

from trainingrun_runtime.errors import LedgerError
from trainingrun_runtime.rollout import ledger


def test_the_ledger_refuses_to_train_a_prompt_twice() -> None:
    book = ledger.Ledger()
    book.left_loader(0, 5)
    book.dispatched(0)
    book.committed(0, version=0)
    book.consumed([0], step=0)
    assert book.get(0).state is ledger.State.CONSUMED and book.get(0).step == 0
    with pytest.raises(LedgerError, match="consumed"):
        book.consumed([0], step=1)
    with pytest.raises(LedgerError, match="twice"):
        book.left_loader(0, 5)


def test_restoring_the_ledger_queues_in_flight_prompts_for_redispatch() -> None:
    book = ledger.Ledger()
    for uid in range(3):
        book.left_loader(uid, uid)
        book.dispatched(uid)
    book.committed(1, version=0)
    restored = ledger.Ledger()
    assert restored.load_state_dict(json.loads(json.dumps(book.state_dict()))) == [0, 2]
    assert restored.queued() == [0, 2]
    assert restored.in_state(ledger.State.COMMITTED) == [1]


def test_a_prompt_whose_worker_was_lost_is_queued_again_and_can_only_be_trained_once() -> None:
    book = ledger.Ledger()
    book.left_loader(0, 5)
    book.dispatched(0)
    book.returned(0)
    assert book.queued() == [0] and book.get(0).state is ledger.State.QUEUED
    book.dispatched(0)
    book.committed(0, version=0)
    book.consumed([0], step=0)
    assert book.get(0).dispatches == 2
    with pytest.raises(LedgerError, match="cannot go in_flight -> queued"):
        book.returned(0)
