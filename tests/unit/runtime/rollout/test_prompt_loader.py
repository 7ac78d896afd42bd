"""The prompt loader: each dataset index once per epoch in a seeded order, and a resume where the saved loader was."""

from __future__ import annotations

import json

import pytest

from trainingrun_runtime.rollout import prompt_loader


def test_the_loader_serves_each_dataset_index_once_per_epoch_in_a_seeded_order() -> None:
    loader = prompt_loader.PromptLoader(dataset_size=10, seed=3)
    first = [loader.next() for _ in range(20)]
    assert [p.uid for p in first] == list(range(20))
    assert sorted(p.index for p in first[:10]) == list(range(10))
    assert [p.index for p in first[:10]] != [p.index for p in first[10:]]
    assert [p.index for p in first] == [prompt_loader.PromptLoader(10, 3).index_of(u) for u in range(20)]


def test_a_restored_loader_continues_where_the_saved_one_was() -> None:
    loader = prompt_loader.PromptLoader(10, 3)
    for _ in range(7):
        loader.next()
    state = loader.state_dict()
    rest = [loader.next() for _ in range(5)]
    restored = prompt_loader.PromptLoader(10, 3)
    restored.load_state_dict(json.loads(json.dumps(state)))
    assert [restored.next() for _ in range(5)] == rest
    with pytest.raises(ValueError, match="dataset_size"):
        prompt_loader.PromptLoader(11, 3).load_state_dict(state)
