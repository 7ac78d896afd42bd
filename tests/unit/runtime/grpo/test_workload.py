"""The workload: the built-in task and a user's model, data and reward built into the same parts (torch and
transformers on tiny models, no Ray)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from support import hfmodels
from trainingrun_runtime import config
from trainingrun_runtime.errors import InvalidSpec
from trainingrun_runtime.grpo import builtin, group_sampling, objective, task, trainer, workload

PROMPTS = ["1 =", "1 2 3 =", "4 5 6 7 8 ="]


def users(tmp_path: Path, *, chat_template: bool = False, **overrides: Any) -> config.TrainerConfig:
    model = hfmodels.llama_dir(tmp_path / "model")
    with open(tmp_path / "problems.jsonl", "w") as f:
        for p in PROMPTS:
            f.write(json.dumps({"q": p, "a": "answer"}) + "\n")
    return config.TrainerConfig.model_validate(
        {
            "model": {"path": str(model)},
            "data": {"path": str(tmp_path / "problems.jsonl"), "promptField": "q", "answerField": "a"},
            "reward": {"kind": "exact"},
            "generation": {"maxNewTokens": 4, "chatTemplate": chat_template},
            "grpo": {"groupSize": 3},
            **overrides,
        }
    )


def test_the_built_in_workload_keeps_the_row_layout_of_earlier_versions() -> None:
    cfg = config.TrainerConfig()
    work = workload.Workload(cfg)
    the_task = task.Task(cfg.task, cfg.seed)
    assert (work.width, work.prompt_width, work.variable) == (the_task.seq_len, the_task.prompt_len, False)
    assert (work.sampling.eos_ids, work.sampling.pad_id) == (frozenset(), 0)
    assert work.sampling.max_new_tokens == the_task.completion_len and work.reward is builtin.partial_credit
    assert work.prompt_ids(3) == the_task.prompt_tokens(the_task.digits_of(3))


def test_a_users_rows_are_padded_to_the_longest_prompt_and_end_at_the_tokenizers_end_token(tmp_path: Path) -> None:
    cfg = users(tmp_path)
    work = workload.Workload(cfg)
    assert work.variable and work.prompt_width == max(len(p.split()) for p in PROMPTS)
    assert (work.sampling.eos_ids, work.sampling.pad_id) == (frozenset({hfmodels.EOS}), hfmodels.PAD)
    model = work.new_model().eval()
    groups = [group_sampling.sample_group(model, work, i, uid=i, version=0) for i in range(len(PROMPTS))]
    for i, g in enumerate(groups):
        rows = g.fields(variable=True)
        assert rows["tokens"].shape == (3, work.width) and rows["mask"].shape == (3, 4)
        assert rows["prompt_len"].tolist() == [len(PROMPTS[i].split())] * 3
        assert rows["tokens"][:, : g.prompt_len].tolist() == [hfmodels.ids(PROMPTS[i])] * 3

    trainer.deterministic()
    tr = trainer.Trainer(cfg)
    fields = [g.fields(variable=True) for g in groups]
    batch = {k: torch.cat([f[k] for f in fields]) for k in fields[0]}
    advantages = objective.group_advantages(torch.randn(3, 3), 1e-4).flatten()
    stats = tr.train_step(batch["tokens"], batch["logprobs"], advantages, batch["mask"], batch["prompt_len"])
    assert tr.version == 1 and torch.isfinite(torch.tensor(stats["loss"]))


def test_the_policy_that_sampled_sees_a_ratio_of_one_on_rows_of_several_lengths(tmp_path: Path) -> None:
    cfg = users(tmp_path)
    work = workload.Workload(cfg)
    model = work.new_model().eval()
    groups = [group_sampling.sample_group(model, work, i, uid=i, version=0) for i in range(len(PROMPTS))]
    tr = trainer.Trainer(cfg)
    tokens = torch.cat([g.tokens for g in groups])
    lens = torch.cat([g.fields(variable=True)["prompt_len"] for g in groups])
    mask = torch.cat([g.mask for g in groups])
    with torch.no_grad():
        logp = tr._logprobs(tr.model, tokens, lens)
    assert torch.allclose(logp * mask, torch.cat([g.logprobs for g in groups]), atol=1e-5)


def test_the_chat_template_wraps_a_prompt_when_asked_for_and_the_tokenizer_has_one(tmp_path: Path) -> None:
    plain = workload.Workload(users(tmp_path, chat_template=True))
    assert plain.prompt_ids(0) == hfmodels.ids(PROMPTS[0])  # asked for, but this tokenizer has none
    tok = plain.tokenizer
    tok.chat_template = "{% for m in messages %}<s> {{ m['content'] }} answer{% endfor %}"
    tok.save_pretrained(tmp_path / "model")
    templated = workload.Workload(
        users(tmp_path / "again", chat_template=True, model={"path": str(tmp_path / "model")})
    )
    assert templated.prompt_ids(0) == hfmodels.ids("<s> 1 = answer")
    not_asked = workload.Workload(users(tmp_path / "third", model={"path": str(tmp_path / "model")}))
    assert not_asked.prompt_ids(0) == hfmodels.ids(PROMPTS[0])


@pytest.mark.parametrize(
    ("broken", "field"),
    [
        ({"model": {"path": "/no/such/model"}}, "spec.trainer.model.path"),
        ({"data": {"path": "/no/such/problems.jsonl"}}, "spec.trainer.data.path"),
        ({"reward": {"kind": "function", "function": "no_such_module:score"}}, "spec.trainer.reward.function"),
    ],
)
def test_check_fails_a_spec_whose_files_are_not_there_naming_the_field(
    tmp_path: Path, broken: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidSpec, match=field.replace(".", r"\.")):
        workload.check(users(tmp_path, **broken))


def test_check_reads_the_data_the_loader_shuffles(tmp_path: Path) -> None:
    cfg = users(tmp_path)
    data = workload.check(cfg)
    assert data is not None and workload.dataset_size(cfg, data) == len(PROMPTS)
    assert workload.check(config.TrainerConfig()) is None
    assert workload.dataset_size(config.TrainerConfig(), None) == config.TaskConfig().dataset_size
