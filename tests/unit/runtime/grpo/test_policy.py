"""The policy: a user's Hugging Face directory loads; sampling is a function of the weights and the draws, stops
where the row ends, and reports the log-probabilities the trainer recomputes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from support import hfmodels
from trainingrun_runtime.errors import InvalidSpec
from trainingrun_runtime.grpo import policy

V = len(hfmodels.vocab())


def _draws(*rows: list[int]) -> torch.Tensor:
    """Uniforms that pick these token ids from a uniform distribution over the vocabulary."""
    return torch.tensor([[(t + 0.5) / V for t in row] for row in rows])


@pytest.fixture(scope="module")
def uniform(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, object]:
    return policy.load(hfmodels.llama_dir(tmp_path_factory.mktemp("uniform"), uniform=True))


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, object]:
    return policy.load(hfmodels.llama_dir(tmp_path_factory.mktemp("llama")))


def test_the_same_draws_give_the_same_completions_and_other_draws_others(llama: tuple[object, object]) -> None:
    model, tok = llama
    s = policy.Sampling(max_new_tokens=6)
    u = torch.rand(4, 6, generator=torch.Generator().manual_seed(1))
    first = policy.sample(model, tok, hfmodels.ids("1 2 +"), u, s)
    again = policy.sample(model, tok, hfmodels.ids("1 2 +"), u.clone(), s)
    other = policy.sample(model, tok, hfmodels.ids("1 2 +"), torch.rand(4, 6, generator=torch.Generator()), s)
    assert torch.equal(first.tokens, again.tokens) and torch.equal(first.logprobs, again.logprobs)
    assert not torch.equal(first.tokens, other.tokens)
    assert first.tokens.shape == (4, 3 + 6)
    assert torch.equal(first.tokens[:, :3], torch.tensor([hfmodels.ids("1 2 +")] * 4))


def test_the_cached_log_probs_are_the_ones_the_trainer_recomputes(llama: tuple[object, object]) -> None:
    model, tok = llama
    s = policy.Sampling(max_new_tokens=5, temperature=0.7)
    got = policy.sample(
        model, tok, hfmodels.ids("3 +"), torch.rand(3, 5, generator=torch.Generator().manual_seed(2)), s
    )
    with torch.no_grad():
        again = policy.completion_logprobs(model, got.tokens, torch.tensor([2, 2, 2]), 5, 0.7)
    torch.testing.assert_close(again, got.logprobs, rtol=0, atol=1e-5)


def test_rows_with_prompts_of_other_lengths_train_in_one_right_padded_batch(llama: tuple[object, object]) -> None:
    model, tok = llama
    s = policy.Sampling(max_new_tokens=4)
    short = policy.sample(
        model, tok, hfmodels.ids("7"), torch.rand(2, 4, generator=torch.Generator().manual_seed(3)), s
    )
    long = policy.sample(model, tok, hfmodels.ids("1 2 + 3 ="), torch.rand(2, 4, generator=torch.Generator()), s)
    width = long.tokens.shape[1]
    padded = torch.nn.functional.pad(short.tokens, (0, width - short.tokens.shape[1]), value=hfmodels.PAD)
    with torch.no_grad():
        batch = policy.completion_logprobs(model, torch.cat([padded, long.tokens]), torch.tensor([1, 1, 5, 5]), 4, 1.0)
    torch.testing.assert_close(batch, torch.cat([short.logprobs, long.logprobs]), rtol=0, atol=1e-5)


def test_an_end_of_sequence_token_ends_its_row_and_is_kept(uniform: tuple[object, object]) -> None:
    model, tok = uniform
    s = policy.Sampling(max_new_tokens=4, eos_ids=frozenset({hfmodels.EOS}), pad_id=hfmodels.PAD)
    got = policy.sample(model, tok, hfmodels.ids("1"), _draws([5, hfmodels.EOS, 6, 7], [6, 7, 8, 9]), s)
    assert got.tokens[0, 1:].tolist() == [5, hfmodels.EOS, hfmodels.PAD, hfmodels.PAD]
    assert got.mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert got.logprobs[0, 2:].tolist() == [0.0, 0.0]
    assert got.texts == ["1", "2 3 4 5"]


def test_a_stop_string_ends_its_row_and_is_cut_from_the_text(uniform: tuple[object, object]) -> None:
    model, tok = uniform
    stop = hfmodels.vocab()["stop"]
    s = policy.Sampling(max_new_tokens=4, stop=("stop",), pad_id=hfmodels.PAD)
    got = policy.sample(model, tok, hfmodels.ids("1"), _draws([5, 6, stop, 7], [8, 9, 10, 11]), s)
    assert got.mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert got.texts[0].strip() == "1 2"


def test_top_p_keeps_only_the_likeliest_tokens(uniform: tuple[object, object]) -> None:
    """Uniform next-token probabilities: top_p 0.25 keeps the first quarter of the vocabulary (a stable sort), so
    even the draw that would pick the last token picks one of those."""
    model, tok = uniform
    s = policy.Sampling(max_new_tokens=1, top_p=0.25)
    got = policy.sample(model, tok, hfmodels.ids("1"), torch.tensor([[0.999], [0.0]]), s)
    kept = -(-V // 4)
    assert got.tokens[:, 1].tolist() == [kept - 1, 0]
    assert got.logprobs[0, 0].item() == pytest.approx(-torch.log(torch.tensor(float(V))).item())


def test_a_bfloat16_model_loads_in_bfloat16_and_samples_in_float32_log_probs(tmp_path: Path) -> None:
    model, tok = policy.load(hfmodels.llama_dir(tmp_path / "m"), "bfloat16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    got = policy.sample(model, tok, hfmodels.ids("1"), torch.full((2, 3), 0.5), policy.Sampling(max_new_tokens=3))
    assert got.logprobs.dtype == torch.float32


def test_a_hub_id_is_refused_with_how_to_stage_the_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidSpec, match=r"spec.trainer.model.path: .*hub id.*downloads nothing.*--local-dir"):
        policy.check_directory("Qwen/Qwen2.5-0.5B")


def test_a_directory_without_config_or_weights_is_refused_naming_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(InvalidSpec, match=r"has no config\.json"):
        policy.check_directory(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(InvalidSpec, match="has no weights"):
        policy.check_directory(tmp_path)


def test_a_directory_without_a_tokenizer_is_refused(tmp_path: Path) -> None:
    d = hfmodels.llama_dir(tmp_path / "m")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (d / name).unlink()
    with pytest.raises(InvalidSpec, match="no tokenizer"):
        policy.load(d)
