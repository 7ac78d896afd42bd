"""The policy: a Hugging Face causal LM from a directory, and the two things GRPO computes with it.

    spec.trainer.model.path ─► check_directory ─► load: AutoModelForCausalLM + AutoTokenizer, local files only
        (nothing is downloaded at run time), dtype float32 | bfloat16, remote code only when asked

    sample(model, prompt ids, uniforms [G, L], Sampling)  ─► Completions
        G completions of one prompt as one batch [G, ·], with the model's KV cache; token i of row g is the
        inverse CDF of the next-token distribution at uniforms[g, i], so a completion depends only on the
        weights and on the uniforms (which the caller derives from names: `group_sampling`), never on which
        worker ran it or what it ran before
    completion_logprobs(model, tokens [B, T], prompt_lens [B], L, τ)  ─► log π(c_i | prefix) [B, L]
        the trainer's side: one forward pass over a right-padded batch of rows with prompts of any length

Row layout, shared by both: `tokens[g] = prompt, completion, pad…` (width prompt + max_new_tokens), `mask[g, i]`
1 for each generated token (the end-of-sequence token included: the model learns to stop) and 0 after the row
ended. The log-probability of a sampled token is that of the temperature-scaled distribution before top-p
truncation: the one the trainer recomputes, so that GRPO's ratio is 1 for the policy that sampled.

Imports torch and transformers: only the processes that hold a model import this module (the trainer and the
generation workers), so the driver and the data plane start without transformers.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from torch.nn import functional as F

from trainingrun_runtime.errors import InvalidSpec

__all__ = [
    "DTYPES",
    "Completions",
    "Sampling",
    "check_directory",
    "completion_logprobs",
    "load",
    "load_tokenizer",
    "sample",
]

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}
"""`spec.trainer.model.dtype` -> the dtype the weights are loaded in (and trained in)."""

_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def check_directory(path: str | Path, field: str = "spec.trainer.model.path") -> Path:
    """`path` if it is a Hugging Face model directory (config.json and weights); else InvalidSpec naming `field`.

    A hub id (`Qwen/Qwen2.5-0.5B`) is not a directory here, and nothing is downloaded at run time: the message
    says to copy the model into a volume and give that path."""
    p = Path(path)
    if not p.is_dir():
        hint = ""
        if not p.is_absolute() and len(p.parts) == 2:
            hint = (
                f" ({str(path)!r} looks like a Hugging Face hub id: trainingrun downloads nothing at run time; copy "
                "the model into a volume of the pod, e.g. with `hf download ... --local-dir`, and give that path)"
            )
        raise InvalidSpec(f"{field}: {p} is not a directory{hint}")
    if not (p / "config.json").is_file():
        raise InvalidSpec(
            f"{field}: {p} has no config.json; give a directory written by save_pretrained (config.json, "
            "safetensors weights, tokenizer files)"
        )
    if not any((p / name).is_file() for name in _WEIGHT_FILES):
        raise InvalidSpec(f"{field}: {p} has no weights ({' or '.join(_WEIGHT_FILES)})")
    return p


def load(
    path: str | Path,
    dtype: Literal["float32", "bfloat16"] = "float32",
    *,
    trust_remote_code: bool = False,
    field: str = "spec.trainer.model.path",
) -> tuple[Any, Any]:
    """(model, tokenizer) from a model directory, local files only; the model in `dtype`, in train mode."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    # One line per event in the driver's log, not a progress bar per load.
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    tokenizer = load_tokenizer(path, trust_remote_code=trust_remote_code, field=field)
    p = Path(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            p, dtype=DTYPES[dtype], local_files_only=True, trust_remote_code=trust_remote_code
        )
    except ValueError as e:
        if "trust_remote_code" in str(e):
            raise InvalidSpec(
                f"{field}: {p} needs its own code to load; set spec.trainer.model.trustRemoteCode: true only if "
                "you trust the code in that directory"
            ) from e
        raise InvalidSpec(f"{field}: {p}: {e}") from e
    model.train()
    return model, tokenizer


def load_tokenizer(path: str | Path, *, trust_remote_code: bool = False, field: str = "spec.trainer.model.path") -> Any:
    """The tokenizer of a model directory, local files only (the generation workers' and the trainer's, without the
    weights)."""
    from transformers import AutoTokenizer

    p = check_directory(path, field)
    try:
        return AutoTokenizer.from_pretrained(p, local_files_only=True, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise InvalidSpec(f"{field}: {p}: no tokenizer could be loaded from it ({e})") from e


def model_card(path: str | Path) -> dict[str, Any]:
    """The directory's config.json (for messages and the checkpoint's record of what was trained)."""
    loaded: dict[str, Any] = json.loads((Path(path) / "config.json").read_text())
    return loaded


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How completions are drawn (`spec.trainer.generation`, with the tokenizer's end-of-sequence ids)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    eos_ids: frozenset[int] = frozenset()
    """A sampled token in this set ends its row (it is kept, and trained on)."""
    stop: tuple[str, ...] = ()
    """A row ends as soon as its decoded completion contains one of these (the text is cut before it)."""
    pad_id: int = 0


@dataclasses.dataclass(frozen=True)
class Completions:
    """G sampled completions of one prompt."""

    tokens: torch.Tensor
    """[G, P + max_new_tokens] int64: the prompt, the completion, then `pad_id`."""
    logprobs: torch.Tensor
    """[G, max_new_tokens] float32: log π(token) at the temperature; 0 where `mask` is 0."""
    mask: torch.Tensor
    """[G, max_new_tokens] float32: 1 for each generated token, 0 after the row ended."""
    texts: list[str]
    """Each completion decoded, without special tokens, cut before the first stop string."""


def _pick(logp: torch.Tensor, u: torch.Tensor, top_p: float) -> torch.Tensor:
    """The inverse CDF at `u` [G] of exp(logp) [G, V] (after top-p truncation); returns token ids [G, 1]."""
    probs = logp.exp()
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
        before = sorted_probs.cumsum(dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(before >= top_p, 0.0)
        cdf = sorted_probs.cumsum(dim=-1)
        k = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None]).clamp_(max=cdf.shape[1] - 1)
        return torch.gather(order, 1, k)
    cdf = probs.cumsum(dim=-1)
    return torch.searchsorted(cdf, (u * cdf[:, -1])[:, None]).clamp_(max=cdf.shape[1] - 1)


def _cut(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """`text` cut before the first stop string in it, and whether there was one."""
    at = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
    return (text, False) if at < 0 else (text[:at], True)


@torch.no_grad()
def sample(model: Any, tokenizer: Any, prompt: Sequence[int], uniforms: torch.Tensor, s: Sampling) -> Completions:
    """Sample `uniforms.shape[0]` completions of `prompt` (token ids) with the KV cache; see the module doc."""
    group, length = uniforms.shape
    if length != s.max_new_tokens:
        raise ValueError(f"uniforms give {length} draws per row, max_new_tokens is {s.max_new_tokens}")
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt)] * group, dtype=torch.int64, device=device)
    out = model(input_ids=ids, use_cache=True)
    cache, logits = out.past_key_values, out.logits[:, -1]
    tokens = torch.full((group, s.max_new_tokens), s.pad_id, dtype=torch.int64)
    logprobs = torch.zeros(group, s.max_new_tokens)
    mask = torch.zeros(group, s.max_new_tokens)
    live = torch.ones(group, dtype=torch.bool)
    texts = [""] * group
    for i in range(s.max_new_tokens):
        logp = F.log_softmax(logits.float().cpu() / s.temperature, dim=-1)
        picked = _pick(logp, uniforms[:, i], s.top_p)
        tokens[:, i] = torch.where(live, picked[:, 0], s.pad_id)
        logprobs[:, i] = torch.where(live, torch.gather(logp, 1, picked)[:, 0], 0.0)
        mask[:, i] = live.float()
        for g in range(group):
            if not live[g]:
                continue
            if int(picked[g, 0]) in s.eos_ids:
                live[g] = False
            elif s.stop:
                text, stopped = _cut(tokenizer.decode(tokens[g, : i + 1], skip_special_tokens=True), s.stop)
                if stopped:
                    live[g], texts[g] = False, text
        if not live.any() or i == s.max_new_tokens - 1:
            break
        out = model(input_ids=tokens[:, i : i + 1].to(device), past_key_values=cache, use_cache=True)
        cache, logits = out.past_key_values, out.logits[:, -1]
    for g in range(group):
        if not texts[g]:
            n = int(mask[g].sum())
            texts[g] = _cut(tokenizer.decode(tokens[g, :n], skip_special_tokens=True), s.stop)[0]
    return Completions(tokens=torch.cat([ids.cpu(), tokens], dim=1), logprobs=logprobs, mask=mask, texts=texts)


def completion_logprobs(
    model: Any, tokens: torch.Tensor, prompt_lens: torch.Tensor, length: int, temperature: float
) -> torch.Tensor:
    """log π(c_i | prefix) at `temperature` for the `length` tokens after each row's prompt: [B, T] -> [B, length].

    Rows are right-padded (`prompt, completion, pad…`), so each row's real tokens sit at positions 0..n-1 and
    never attend to a pad; the entries past a row's end are whatever the pads give, for the caller's mask."""
    device = next(model.parameters()).device
    inputs = tokens[:, :-1].to(device)
    at = (prompt_lens[:, None] - 1 + torch.arange(length)[None, :]).to(device)  # [B, L]: positions predicting c_i
    logits = model(input_ids=inputs, use_cache=False).logits
    picked = torch.gather(logits, 1, at[:, :, None].expand(-1, -1, logits.shape[-1]))
    logp = F.log_softmax(picked.float() / temperature, dim=-1)
    targets = torch.gather(tokens.to(device), 1, at + 1)
    return torch.gather(logp, 2, targets[:, :, None]).squeeze(2).cpu()
