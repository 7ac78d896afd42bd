"""The built-in example as Hugging Face parts: a tiny GPT-2-shaped model, a digit tokenizer, generated prompts and
a partial-credit reward, for `grpo.policy`'s path (the one a user's model takes).

    spec.trainer.model {dModel, nLayers, nHeads, dFf}  ─► model(): GPT2LMHeadModel, PyTorch's default init from
                                                           derive_seed(seed, "init")
    spec.trainer.task {kind, digits, length, datasetSize} ─► tokenizer(): "1 2 3" -> [<s>, 1, 2, 3, <sep>]
                                                           Prompts: prompt(i) "d_1 … d_L" of digits from (seed, i)
                                                           answer(i): reverse | copy | increment, as text
    reward: partial_credit(prompt, completion, answer) = the fraction of the answer's places the completion has right

Token ids are those of the hand-written model this replaces (`<s>` 0, `<sep>` 1, digit d: d + 2); `<s>` and `<sep>`
are ordinary words to the decoder, so a completion that samples one keeps its place and scores it as wrong.

Why GPT-2's shape and not Llama's: the example's model has one layer (`manifests/examples/tiny.yaml`), and the
reverse task needs each answer place to find its prompt place. A rotary model without an absolute position cannot
tell the answer's second place from its third in one layer (both are digits at the same relative distances), so a
one-layer Llama stops at about half the reward (measured: 0.44–0.55 after 120 steps, where this model and the old
one reach 0.73–1.0). GPT-2 learns positions as the old model did; a user's Llama or Qwen2 goes through the same
code (`tests/support/hfmodels.py` makes one for the tests).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from trainingrun_runtime import config
from trainingrun_runtime.grpo import seeding, task

__all__ = ["BOS", "SEP", "Prompts", "model", "partial_credit", "tokenizer"]

BOS, SEP = task.BOS, task.SEP


def tokenizer(cfg: config.TaskConfig) -> Any:
    """A word-level tokenizer over `<s>`, `<sep>` and the task's digits that wraps every prompt as `<s> … <sep>`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = {"<s>": BOS, "<sep>": SEP, **{str(d): d + 2 for d in range(cfg.digits)}}
    tok = Tokenizer(models.WordLevel(words, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A <sep>", special_tokens=[("<s>", BOS), ("<sep>", SEP)]
    )
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # words joined by single spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok)  # type: ignore[no-untyped-call]


def model(cfg: config.ModelConfig, the_task: task.Task, seed: int) -> Any:
    """The version-0 policy: same `seed` ⇒ same weights, whatever the caller's RNG state."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.pytorch_utils import Conv1D

    gpt2 = GPT2Config(
        vocab_size=the_task.vocab_size,
        n_positions=the_task.seq_len,
        n_embd=cfg.d_model,
        n_layer=cfg.n_layers,
        n_head=cfg.n_heads,
        n_inner=cfg.d_ff,
        activation_function="gelu",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=False,
        bos_token_id=BOS,
        eos_token_id=None,
        pad_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seeding.derive_seed(seed, "init"))
        built = GPT2LMHeadModel(gpt2)
        # PyTorch's default init (an embedding N(0, 1), a linear map uniform in ±1/sqrt(fan_in)) rather than
        # GPT-2's N(0, 0.02): at this size the small init leaves the first policy nearly constant, and GRPO's
        # signal with it (the old model, with these inits, learned in tens of steps).
        with torch.no_grad():
            for module in built.modules():
                if isinstance(module, torch.nn.Embedding | torch.nn.Linear | torch.nn.LayerNorm):
                    module.reset_parameters()
                elif isinstance(module, Conv1D):  # GPT-2's linear maps, weight [in, out]
                    torch.nn.init.kaiming_uniform_(module.weight.T, a=math.sqrt(5))
                    bound = 1 / math.sqrt(module.weight.shape[0])
                    module.bias.uniform_(-bound, bound)
    built.train()
    return built


@dataclasses.dataclass(frozen=True)
class Prompts:
    """The generated dataset: prompt `index` and its answer as text, derived from (seed, index); nothing stored."""

    the_task: task.Task

    def __len__(self) -> int:
        return self.the_task.cfg.dataset_size

    def prompt_of(self, index: int) -> str:
        return " ".join(str(d) for d in self.the_task.digits_of(index))

    def answer_of(self, index: int) -> str:
        return " ".join(str(d) for d in self.the_task.answer(self.the_task.digits_of(index)))


def partial_credit(prompt: str, completion: str, answer: str) -> float:
    """The fraction of the answer's words the completion has in the same place (a missing word is wrong)."""
    want, got = answer.split(), completion.split()
    return sum(int(i < len(got) and got[i] == w) for i, w in enumerate(want)) / len(want)
