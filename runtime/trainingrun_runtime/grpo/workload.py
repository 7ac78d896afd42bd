"""What a run trains on, built from its `spec.trainer` in the same way for the built-in task and a user's model.

    spec.trainer                                 Workload
    model {dModel, …}, task {…}            ─►    builtin.model, builtin.tokenizer, builtin.Prompts, partial credit
    model {path, dtype}, data {…}, reward  ─►    policy.load, grpo.dataset.load, grpo.rewards.build
    generation {…}                         ─►    policy.Sampling (the end and pad ids from the tokenizer)

Everything after this (sampling, rewards, the rows, the loss, the checkpoint) is the same code for both.

Rows. A group is stored at the run's fixed width, `prompt_width + max_new_tokens` tokens per row, right-padded, so
that any rows stack into one batch. The built-in task's prompts all have `task.length + 2` tokens and its
completions exactly `task.length`, so its rows hold `tokens`, `logprobs` and `rewards` as they always have (a
checkpoint's data plane of an earlier version still restores). A run on the user's data has prompts of any length
and completions that end early, so its rows also carry `prompt_len` (the row's prompt tokens) and `mask` (1 for each
generated token): `ROW_FIELDS`.

`check(cfg, base)` opens the model directory, reads the data and imports the reward function in the driver before
Ray starts, so a wrong field fails the attempt as `InvalidSpec` (naming it) before any training.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from trainingrun_runtime import config
from trainingrun_runtime.grpo import builtin, dataset, policy, rewards, task

__all__ = ["ROW_FIELDS", "Prompts", "Workload", "check", "dataset_size", "device", "variable_rows"]

ROW_FIELDS = ("prompt_len", "mask")
"""The fields a row of a run on the user's data carries besides tokens, logprobs and rewards (`variable_rows`)."""


class Prompts(Protocol):
    """Prompt `index` and its answer, as text."""

    def __len__(self) -> int: ...

    def prompt_of(self, index: int) -> str: ...

    def answer_of(self, index: int) -> str: ...


@dataclasses.dataclass(frozen=True)
class _DataPrompts:
    data: dataset.Dataset

    def __len__(self) -> int:
        return len(self.data)

    def prompt_of(self, index: int) -> str:
        return self.data.prompts[index]

    def answer_of(self, index: int) -> str:
        return self.data.answers[index]


def variable_rows(cfg: config.TrainerConfig) -> bool:
    """Whether the run's rows carry `ROW_FIELDS` (its prompts and completions vary in length)."""
    return cfg.data is not None


def check(cfg: config.TrainerConfig) -> dataset.Dataset | None:
    """Everything about the spec that only its files can tell, before Ray starts; the data, if the run has any.

    Raises InvalidSpec naming the field: a model directory that is not one, a data file that cannot be read, a
    reward function that cannot be imported."""
    if cfg.model.path is not None:
        policy.check_directory(cfg.model.path)
    if cfg.reward is not None:
        rewards.build(cfg.reward.kind, cfg.reward.function)
    return _read(cfg.data)


def _read(data: config.DataConfig | None) -> dataset.Dataset | None:
    return None if data is None else dataset.load(data.path, data.prompt_field, data.answer_field)


def dataset_size(cfg: config.TrainerConfig, data: dataset.Dataset | None) -> int:
    """Prompts in one epoch: the data's rows, or the built-in task's `datasetSize`."""
    return cfg.task.dataset_size if data is None else len(data)


class Workload:
    """The policy's first weights, its tokenizer, the prompts, the reward and the sampling of one run.

    `with_prompts=False` (the trainer) skips the data and the reward, which only the generation workers use."""

    def __init__(self, cfg: config.TrainerConfig, *, with_prompts: bool = True) -> None:
        self.cfg = cfg
        self._task = task.Task(cfg.task, cfg.seed)
        self.variable = variable_rows(cfg)
        if cfg.model.path is None:
            self.tokenizer: Any = builtin.tokenizer(cfg.task)
            max_new, eos, pad = self._task.completion_len, frozenset[int](), 0
        else:
            self.tokenizer = policy.load_tokenizer(cfg.model.path, trust_remote_code=cfg.model.trust_remote_code)
            max_new = cfg.generation.max_new_tokens or config.DEFAULT_MAX_NEW_TOKENS
            eos = _ids(self.tokenizer.eos_token_id)
            pad = next(iter(sorted(_ids(self.tokenizer.pad_token_id) or eos)), 0)
        self.sampling = policy.Sampling(
            max_new_tokens=max_new,
            temperature=cfg.temperature,
            top_p=cfg.generation.top_p,
            eos_ids=eos,
            stop=tuple(cfg.generation.stop),
            pad_id=pad,
        )
        self.prompts: Prompts | None = None
        self._ids: list[list[int]] | None = None
        """Every prompt's ids, for a run on the user's data (tokenized once: the width needs them all)."""
        self.reward: Callable[[str, str, str], float] = builtin.partial_credit
        self.prompt_width = self._task.prompt_len
        if not with_prompts:
            return
        data = _read(cfg.data)
        if data is None:
            self.prompts = builtin.Prompts(self._task)
        else:
            self.prompts = _DataPrompts(data)
            self._ids = [self._encode(i) for i in range(len(data))]
            self.prompt_width = max(len(ids) for ids in self._ids)
        if cfg.reward is not None:
            self.reward = rewards.build(cfg.reward.kind, cfg.reward.function).score

    @property
    def width(self) -> int:
        """Tokens per stored row: the longest prompt and the most tokens a completion may have."""
        return self.prompt_width + self.sampling.max_new_tokens

    def new_model(self) -> Any:
        """The version-0 policy, in train mode, on `device()`: the same weights for the same config, in every
        process."""
        if self.cfg.model.path is None:
            return builtin.model(self.cfg.model, self._task, self.cfg.seed).to(device())
        m = self.cfg.model
        model, _ = policy.load(m.path, m.dtype, trust_remote_code=m.trust_remote_code)  # type: ignore[arg-type]
        return model.to(device())

    def prompt_ids(self, index: int) -> list[int]:
        """Prompt `index` as the model reads it: through the chat template when asked for and the tokenizer has one."""
        return self._encode(index) if self._ids is None else self._ids[index]

    def _encode(self, index: int) -> list[int]:
        assert self.prompts is not None, "a workload without prompts (the trainer's)"
        text = self.prompts.prompt_of(index)
        if self.cfg.generation.chat_template and getattr(self.tokenizer, "chat_template", None):
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
            )
            return list(ids)
        return list(self.tokenizer(text)["input_ids"])


def device() -> str:
    """Where this process's models go: `cuda` when Ray gave it a GPU (`driver.placement.gpus`), else `cpu`."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _ids(value: int | Sequence[int] | None) -> frozenset[int]:
    if value is None:
        return frozenset()
    return frozenset([value]) if isinstance(value, int) else frozenset(value)
