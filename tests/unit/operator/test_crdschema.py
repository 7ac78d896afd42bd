"""The CRD's schema of spec.trainer, generated from the runtime's config model: what each kind of field becomes,
that every field is there, and what the converter refuses (test_manifests checks the CRD file against it)."""

from __future__ import annotations

import typing
from typing import Any, Literal

import pydantic
import pytest

from trainingrun_operator.core import crdschema
from trainingrun_runtime.config import TrainerConfig


def at(schema: dict[str, Any], dotted: str) -> dict[str, Any]:
    node = schema
    for part in dotted.split("."):
        node = node["properties"][part]
    return node


SCHEMA = crdschema.trainer_schema()


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ("steps", {"type": "integer", "minimum": 1, "maximum": 10**9}),
        ("seed", {"type": "integer", "minimum": 0, "maximum": 2**53 - 1}),
        ("task.digits", {"type": "integer", "minimum": 2, "maximum": 64}),
        ("grpo.lr", {"type": "number", "minimum": 0.0, "exclusiveMinimum": True, "maximum": 10.0}),
        ("grpo.klCoef", {"type": "number", "minimum": 0.0, "maximum": 1000.0, "nullable": True}),
        ("sampler.kind", {"type": "string", "enum": ["in_order", "async"]}),
        ("task.kind", {"type": "string", "enum": ["reverse", "copy", "increment"]}),
        (
            "grpo.adamBetas",
            {
                "type": "array",
                "minItems": 2,
                "maxItems": 2,
                "items": {"type": "number", "minimum": 0.0, "maximum": 1.0, "exclusiveMaximum": True},
            },
        ),
    ],
)
def test_each_kind_of_field_becomes_its_openapi_counterpart(field: str, expected: dict[str, Any]) -> None:
    node = {k: v for k, v in at(SCHEMA, field).items() if k != "description"}
    assert node == expected


def test_every_field_of_the_config_is_there_under_its_camel_case_name_and_nothing_else() -> None:
    def names(model: type[pydantic.BaseModel], schema: dict[str, Any], prefix: str) -> list[str]:
        found = []
        assert set(schema["properties"]) == {f.alias for f in model.model_fields.values()}, prefix
        for field in model.model_fields.values():
            assert field.alias is not None
            found.append(f"{prefix}{field.alias}")
            nested = [t for t in (field.annotation, *typing.get_args(field.annotation)) if _is_model(t)]
            if nested:  # a model, or a model or None
                found += names(nested[0], schema["properties"][field.alias], f"{prefix}{field.alias}.")
        return found

    assert len(names(TrainerConfig, SCHEMA, "")) == 46  # 7 objects, 39 leaves


def _is_model(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, pydantic.BaseModel)


def test_objects_are_typed_closed_and_carry_no_defaults_but_an_absent_trainer_is_empty() -> None:
    def walk(node: dict[str, Any], path: str) -> list[str]:
        bad = [f"{path}: {k}" for k in ("default", "additionalProperties", "$ref", "anyOf", "title") if k in node]
        bad += [] if "type" in node else [f"{path}: no type"]
        bad += [f"{path}: keeps unknown fields"] if node.get("x-kubernetes-preserve-unknown-fields") else []
        for name, child in node.get("properties", {}).items():
            bad += walk(child, f"{path}.{name}")
        return bad + (walk(node["items"], f"{path}[]") if "items" in node else [])

    top = {k: v for k, v in SCHEMA.items() if k != "default"}
    assert walk(top, "trainer") == []
    assert SCHEMA["default"] == {}  # a spec.driver program may need no spec.trainer; the CRD's rules read it
    assert all(node["description"] for node in SCHEMA["properties"].values())


def test_the_models_rule_across_fields_comes_along_as_cel_with_the_models_defaults() -> None:
    rule, *path_rules = at(SCHEMA, "model")["x-kubernetes-validations"]
    assert [r["fieldPath"] for r in path_rules] == [".path", ".path"]
    assert rule["rule"] == "(has(self.dModel) ? self.dModel : 64) % (has(self.nHeads) ? self.nHeads : 4) == 0"
    assert rule["fieldPath"] == ".nHeads"


class _Unbounded(pydantic.BaseModel):
    name: str


class _NoMaximum(pydantic.BaseModel):
    count: int = pydantic.Field(default=1, ge=1)


class _NoMinimum(pydantic.BaseModel):
    seconds: float = pydantic.Field(default=1.0, le=60)


class _PastFloat(pydantic.BaseModel):
    seed: int = pydantic.Field(default=0, ge=0, le=2**63 - 1)


class _Union(pydantic.BaseModel):
    value: int | str = 0


class _Fine(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", alias_generator=pydantic.alias_generators.to_camel)

    mode_name: Literal["a", "b"] = "a"
    label: str = pydantic.Field(default="", max_length=8)
    ratio: float = pydantic.Field(default=0.5, gt=0, lt=1)


@pytest.mark.parametrize(
    ("model", "words"),
    [
        (_Unbounded, "_Unbounded.name: a string field needs a max_length"),
        (_NoMaximum, "_NoMaximum.count: a number field needs both bounds"),
        (_NoMinimum, "_NoMinimum.seconds: a number field needs both bounds"),
        (_PastFloat, "_PastFloat.seed: a bound past 2\\*\\*53"),
        (_Union, "unions"),
    ],
)
def test_a_field_the_converter_cannot_check_as_the_model_does_stops_the_generation(
    model: type[pydantic.BaseModel], words: str
) -> None:
    with pytest.raises(ValueError, match=words):
        crdschema.openapi(model)


def test_a_bounded_string_and_both_exclusive_bounds_convert() -> None:
    assert crdschema.openapi(_Fine)["properties"] == {
        "modeName": {"type": "string", "enum": ["a", "b"]},
        "label": {"type": "string", "maxLength": 8},
        "ratio": {"type": "number", "minimum": 0, "maximum": 1, "exclusiveMinimum": True, "exclusiveMaximum": True},
    }
