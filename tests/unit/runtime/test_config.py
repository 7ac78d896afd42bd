"""RuntimeConfig: aliases, forbidden extras, defaults, and which fields enter the config hash."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from trainingrun_runtime import config


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
    ]
    for model in models:
        for name, field in model.model_fields.items():
            assert field.description and "Default" in field.description, f"{model.__name__}.{name}"


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
