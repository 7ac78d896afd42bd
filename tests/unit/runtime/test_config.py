"""RuntimeConfig: aliases, forbidden extras, defaults, and which fields enter the config hash."""

from __future__ import annotations

import pathlib
import re
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from trainingrun_runtime import config

REPO = pathlib.Path(__file__).resolve().parents[3]


def test_camel_case_and_snake_case_keys_build_the_same_config() -> None:
    camel = config.RuntimeConfig.model_validate(
        {
            "trainer": {"promptsPerStep": 4, "grpo": {"groupSize": 4, "klCoef": 0.1}},
            "checkpoint": {"savePeriod": 5, "keepLast": 2, "keepEvery": 10},
        }
    )
    snake = config.RuntimeConfig.model_validate(
        {
            "trainer": {"prompts_per_step": 4, "grpo": {"group_size": 4, "kl_coef": 0.1}},
            "checkpoint": {"save_period": 5, "keep_last": 2, "keep_every": 10},
        }
    )
    assert camel == snake
    assert camel.checkpoint.save_period == 5
    assert camel.trainer.grpo.kl_coef == 0.1


def test_an_unknown_key_is_an_error_that_names_it() -> None:
    with pytest.raises(ValidationError, match="groupSise"):
        config.RuntimeConfig.model_validate({"trainer": {"grpo": {"groupSise": 4}}})


def test_an_empty_document_gives_the_documented_defaults() -> None:
    cfg = config.RuntimeConfig.model_validate({})
    assert cfg.trainer.sampler.kind == "in_order"
    assert cfg.trainer.grpo.kl_coef is None
    assert cfg.checkpoint.keep_every is None


def test_every_field_has_a_description_that_states_its_default() -> None:
    models: list[type[BaseModel]] = [
        config.ModelConfig,
        config.TaskConfig,
        config.GRPOConfig,
        config.SamplerConfig,
        config.TrainerConfig,
        config.CheckpointConfig,
        config.DataConfig,
        config.RewardConfig,
        config.TextGenerationConfig,
    ]
    for model in models:
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name}"
            assert "Default" in field.description or field.is_required(), f"{model.__name__}.{name}"


def test_heads_must_divide_the_width() -> None:
    with pytest.raises(ValidationError, match="must divide"):
        config.ModelConfig(d_model=64, n_heads=5)


@pytest.mark.parametrize(("betas", "position"), [((1.0, 0.9), 0), ((0.9, -0.1), 1), ((0.9, 1.5), 1)])
def test_adam_betas_outside_zero_to_one_are_refused_naming_the_position(
    betas: tuple[float, float], position: int
) -> None:
    with pytest.raises(ValidationError) as caught:
        config.GRPOConfig.model_validate({"adamBetas": betas})
    assert [e["loc"] for e in caught.value.errors()] == [("adamBetas", position)]


@pytest.mark.parametrize(
    "change",
    [
        {"steps": 9999},
        {"logEvery": 1},
        {"generationWorkers": 7},
    ],
)
def test_harmless_trainer_fields_do_not_change_the_hash(change: dict[str, object]) -> None:
    base = config.RuntimeConfig()
    other = config.RuntimeConfig.model_validate({"trainer": change, "checkpoint": {"savePeriod": 3, "keepLast": 9}})
    assert config.config_hash(base) == config.config_hash(other)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"grpo": {"lr": 0.01}}, "trainer.grpo.lr"),
        ({"grpo": {"klCoef": 0.05}}, "trainer.grpo.kl_coef"),
        ({"model": {"dModel": 32}}, "trainer.model.d_model"),
        ({"sampler": {"kind": "async"}}, "trainer.sampler.kind"),
        ({"task": {"kind": "copy"}}, "trainer.task.kind"),
        ({"seed": 1}, "trainer.seed"),
        ({"promptsPerStep": 3}, "trainer.prompts_per_step"),
    ],
)
def test_math_fields_change_the_hash_and_the_diff_names_them(change: dict[str, object], field: str) -> None:
    base = config.RuntimeConfig()
    other = config.RuntimeConfig.model_validate({"trainer": change})
    assert config.config_hash(base) != config.config_hash(other)
    diff = config.math_diff(config.math_fields(base), config.math_fields(other))
    assert len(diff) == 1 and diff[0].startswith(field + ":")


def test_the_hash_is_stable_across_processes_for_equal_configs() -> None:
    a = config.RuntimeConfig.model_validate({"trainer": {"grpo": {"adamBetas": [0.9, 0.99]}}})
    assert config.config_hash(a) == config.config_hash(config.RuntimeConfig())
    assert len(config.config_hash(a)) == 64


USER_MODEL: dict[str, Any] = {
    "model": {"path": "/models/mine"},
    "data": {"path": "problems.jsonl", "promptField": "question"},
    "reward": {"kind": "math"},
}


@pytest.mark.parametrize(
    ("trainer", "message"),
    [
        ({**USER_MODEL, "model": {"path": "/m", "dModel": 32}}, "size the built-in model"),
        ({"model": {"dtype": "bfloat16"}}, "apply to a model from `path`"),
        ({"data": {"path": "problems.jsonl"}, "reward": {"kind": "exact"}}, "data needs a model from model.path"),
        ({"model": {"path": "/m"}}, "set data"),
        ({**USER_MODEL, "task": {"kind": "copy"}}, "remove task"),
        ({k: v for k, v in USER_MODEL.items() if k != "reward"}, "data needs reward"),
        ({"generation": {"maxNewTokens": 8}}, "task.length tokens"),
        ({"generation": {"temperature": 0.5}, "grpo": {"temperature": 0.7}}, "keep generation.temperature"),
        ({**USER_MODEL, "reward": {"kind": "function"}}, "exactly when kind is `function`"),
        ({**USER_MODEL, "reward": {"kind": "exact", "function": "mine:score"}}, "exactly when kind is `function`"),
        ({**USER_MODEL, "reward": {"kind": "function", "function": "not a name"}}, "should match pattern"),
    ],
)
def test_the_fields_of_a_model_of_ones_own_refuse_what_contradicts_them(trainer: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        config.TrainerConfig.model_validate(trainer)


def test_a_model_of_ones_own_reads_its_defaults_and_survives_a_round_trip() -> None:
    cfg = config.TrainerConfig.model_validate(USER_MODEL)
    assert (cfg.model.dtype, cfg.model.trust_remote_code, cfg.data and cfg.data.answer_field) == (
        "float32",
        False,
        "answer",
    )
    assert cfg.temperature == 1.0 and cfg.generation.max_new_tokens is None
    again = config.TrainerConfig.model_validate(cfg.model_dump(by_alias=True))
    assert again == cfg


def test_a_configuration_that_uses_none_of_the_later_fields_hashes_as_it_did_before_they_existed() -> None:
    """Hashes of the tiny example and of all defaults, as written by checkpoints before model.path, data, reward and
    generation existed: such a checkpoint still resumes."""
    tiny = yaml.safe_load((REPO / "manifests" / "examples" / "tiny.yaml").read_text())["spec"]["trainer"]
    assert config.config_hash(config.RuntimeConfig.model_validate({"trainer": tiny})) == (
        "deca0e05249294942d0a90363bcc02fa7ec4a0c7debe629a458b60d227de965d"
    )
    assert config.config_hash(config.RuntimeConfig()) == (
        "703a2106447a4c72794eb9fca588348afd6274698d89aeb0857e65a118d8de00"
    )


def test_the_later_fields_enter_the_hash_once_they_are_used() -> None:
    base = config.RuntimeConfig.model_validate({"trainer": USER_MODEL})
    for change in ({"generation": {"topP": 0.9}}, {"reward": {"kind": "exact"}}, {"model": {"path": "/other"}}):
        changed = config.RuntimeConfig.model_validate({"trainer": {**USER_MODEL, **change}})
        assert config.config_hash(changed) != config.config_hash(base), change
