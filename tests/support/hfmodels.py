"""Tiny Hugging Face model directories, made on the spot (nothing may be downloaded here).

`llama_dir` writes what a user brings: a Llama-shaped causal LM saved with `save_pretrained` (config.json,
model.safetensors) and a word-level tokenizer saved with `save_pretrained` (tokenizer.json and its config), with
`<s>`, `</s>`, `<pad>`, `<unk>` and one token per word of `WORDS`. With `uniform=True` the output head is zero, so
every next-token distribution is uniform and a test chooses the sampled token through its uniform draw: token
`floor(u · V)`.
"""

from __future__ import annotations

from pathlib import Path

import torch

SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")
WORDS = (*"0123456789", "+", "=", "answer", "stop")
PAD, BOS, EOS = 0, 1, 2


def vocab() -> dict[str, int]:
    """Token -> id: the specials first (pad 0, bos 1, eos 2, unk 3), then the words."""
    return {t: i for i, t in enumerate(SPECIALS + WORDS)}


def save_tokenizer(path: Path) -> None:
    """A whitespace-split word-level tokenizer over `vocab()`, saved with save_pretrained."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab(), unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with single spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    fast.save_pretrained(path)


def llama_dir(
    path: Path,
    *,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 2,
    seed: int = 0,
    uniform: bool = False,
    dtype: torch.dtype = torch.float32,
) -> Path:
    """A Llama-shaped model and its tokenizer under `path` (created); returns `path`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    cfg = LlamaConfig(
        vocab_size=len(vocab()),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    if uniform:
        with torch.no_grad():
            model.lm_head.weight.zero_()
    model.to(dtype).save_pretrained(path)
    save_tokenizer(path)
    return path


def ids(text: str) -> list[int]:
    """The ids of a whitespace-separated text of `vocab()` words."""
    v = vocab()
    return [v[w] for w in text.split()]
