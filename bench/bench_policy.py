"""Benchmark: our generation and training on a Hugging Face model against bare loops, same model, batch, lengths.

A Llama-shaped causal LM of about 17M parameters (vocabulary 8192, width 384, 6 layers), made here and loaded
through `grpo.policy.load` from a directory saved with `save_pretrained`, as a user's model is. One thread, as the
trainer and the generators run (`trainer.deterministic`). In one run, alternating, the median of each side:

    generation: 8 completions of one 32-token prompt, 64 new tokens each
        ours: policy.sample (KV cache, inverse-CDF draws, EOS and row masks, texts decoded)
        bare: the model's KV-cached forward, softmax, torch.multinomial, append; nothing else
        hf_generate_vs_bare = bare seconds / our seconds (tokens per second, ours over bare)   goal >= 0.8
    training: one GRPO step on 8 rows of 32 + 64 tokens
        ours: policy.completion_logprobs, objective.policy_loss (clip, masked mean), backward, clip_grad_norm_,
              AdamW step
        bare: the model's forward, log_softmax, gather, -(advantage · log-prob).mean(), backward, AdamW step
        hf_train_vs_bare = bare seconds / our seconds                                         goal >= 0.8

Writes its figures under "policy" in bench-results.json at the repository root and prints them.

    .venv/bin/python bench/bench_policy.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import results  # bench/results.py: bench-results.json
import torch

from trainingrun_runtime.grpo import objective, policy, trainer

VOCAB, WIDTH, LAYERS, HEADS, FF = 8192, 384, 6, 6, 1024
GROUP, PROMPT, NEW = 8, 32, 64


def make_model(path: Path) -> None:
    """The benchmark's model and a word-level tokenizer over VOCAB words, saved as a user's directory."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{f"w{i}": i for i in range(4, VOCAB)}}
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    ).save_pretrained(path)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        intermediate_size=FF,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=PROMPT + NEW,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(path)


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    trainer.deterministic()
    with tempfile.TemporaryDirectory(prefix="bench-policy-") as d:
        make_model(Path(d))
        model, tok = policy.load(d)
    params = sum(t.numel() for t in model.parameters())
    prompt = [int(t) for t in torch.randint(4, VOCAB, (PROMPT,), generator=torch.Generator().manual_seed(1))]
    sampling = policy.Sampling(max_new_tokens=NEW, eos_ids=frozenset({2}), pad_id=0)

    def ours_generate() -> None:
        uniforms = torch.rand(GROUP, NEW, generator=torch.Generator().manual_seed(2))
        policy.sample(model, tok, prompt, uniforms, sampling)

    @torch.no_grad()
    def bare_generate() -> None:
        gen = torch.Generator().manual_seed(2)
        ids = torch.tensor([prompt] * GROUP)
        out = model(input_ids=ids, use_cache=True)
        for _ in range(NEW):
            probs = torch.softmax(out.logits[:, -1].float(), dim=-1)
            nxt = torch.multinomial(probs, 1, generator=gen)
            ids = torch.cat([ids, nxt], dim=1)
            out = model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)

    rows = torch.randint(4, VOCAB, (GROUP, PROMPT + NEW), generator=torch.Generator().manual_seed(3))
    prompt_lens = torch.full((GROUP,), PROMPT)
    advantages = torch.randn(GROUP, generator=torch.Generator().manual_seed(4))
    mask = torch.ones(GROUP, NEW)
    with torch.no_grad():
        old = policy.completion_logprobs(model, rows, prompt_lens, NEW, 1.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, foreach=False)

    def ours_train() -> None:
        logp = policy.completion_logprobs(model, rows, prompt_lens, NEW, 1.0)
        loss, _ = objective.policy_loss(logp, old, advantages, mask, 0.2)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    def bare_train() -> None:
        logits = model(input_ids=rows[:, :-1]).logits[:, PROMPT - 1 :]
        logp = torch.gather(torch.log_softmax(logits.float(), dim=-1), 2, rows[:, PROMPT:, None]).squeeze(2)
        loss = -(advantages[:, None] * logp).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()

    ours_generate(), bare_generate(), ours_train(), bare_train()  # warm-up: allocator, first-call paths
    times: dict[str, list[float]] = {"ours_gen": [], "bare_gen": [], "ours_train": [], "bare_train": []}
    for i in range(a.repeat):
        order = [("ours_gen", ours_generate), ("bare_gen", bare_generate)]
        order += [("ours_train", ours_train), ("bare_train", bare_train)]
        for name, fn in order if i % 2 == 0 else order[::-1]:
            times[name].append(timed(fn))
    med = {k: statistics.median(v) for k, v in times.items()}
    figures = {
        "hf_model_parameters": params,
        "hf_generate_tokens_per_s": round(GROUP * NEW / med["ours_gen"], 1),
        "hf_generate_bare_tokens_per_s": round(GROUP * NEW / med["bare_gen"], 1),
        "hf_generate_vs_bare": round(med["bare_gen"] / med["ours_gen"], 3),
        "hf_train_tokens_per_s": round(GROUP * (PROMPT + NEW) / med["ours_train"], 1),
        "hf_train_bare_tokens_per_s": round(GROUP * (PROMPT + NEW) / med["bare_train"], 1),
        "hf_train_vs_bare": round(med["bare_train"] / med["ours_train"], 3),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    results.merge("policy", figures)
    for key, value in figures.items():
        print(f"{key:<40} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
