"""The mutation corpus of the admission test (support/mutations.py), checked without a cluster: every mutation
breaks the CRD's schema (jsonschema; CEL rules and the int64 range aside, which only the API server checks),
every field of spec.trainer is mutated, the examples themselves pass, and the operator's own check (the second
line) rejects the same mutations, how a scalar is written aside.

tests/integration/test_operator_admission.py sends the same corpus to the real API server.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest

from support import mutations
from trainingrun_operator.core import validation

CORPUS = mutations.corpus()


@pytest.fixture(scope="module")
def validator(openapi_to_jsonschema: Callable[..., Any]) -> jsonschema.protocols.Validator:
    schema = openapi_to_jsonschema(mutations.schema(), closed=True)
    return jsonschema.Draft202012Validator(schema)


def test_the_corpus_has_a_few_hundred_mutations_of_every_example() -> None:
    assert len(CORPUS) >= 300
    for example in mutations.EXAMPLES:
        assert sum(m.name.startswith(f"{example}:") for m in CORPUS) >= 150


def test_the_examples_themselves_pass_the_schema(validator: jsonschema.protocols.Validator) -> None:
    for _, doc in mutations.examples():
        validator.validate(doc)


def test_every_mutation_a_json_schema_can_check_breaks_the_crds_schema_at_its_field(
    validator: jsonschema.protocols.Validator,
) -> None:
    missed = []
    for m in CORPUS:
        if not m.schema_checks:
            continue
        errors = list(validator.iter_errors(m.doc))
        if m.field not in {field for e in errors for field in _fields(e)}:
            missed.append(f"{m.name}: {[e.message[:80] for e in errors]}")
    assert missed == []


def _fields(error: jsonschema.ValidationError) -> list[str]:
    """The fields an error names, as the API server writes them (an unknown key: the key under its object)."""
    at = tuple(error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        return [mutations.shown((*at, key)) for key in set(error.instance) - set(error.schema.get("properties", {}))]
    return [mutations.shown(at)]


def test_every_field_of_the_trainer_schema_is_mutated() -> None:
    trainer = mutations.schema()["properties"]["spec"]["properties"]["trainer"]
    leaves = set()

    def walk(node: dict[str, Any], path: str) -> None:
        leaves.add(path)
        for name, child in node.get("properties", {}).items():
            walk(child, f"{path}.{name}")

    walk(trainer, "spec.trainer")
    mutated = {m.field for m in CORPUS}
    assert leaves - mutated == set()


def test_the_operators_own_check_rejects_the_same_mutations_but_how_a_scalar_is_written_naming_the_field() -> None:
    """validation.run_problems: the second line, and what `trainingrun run` checks without an API server."""
    missed = []
    for m in CORPUS:
        if not m.model_checks:
            continue
        paths = [_as_api_server_writes(p.path) for p in validation.run_problems(m.doc)]
        if not any(p.startswith(m.field) or (m.field.startswith(p) and p != "spec") for p in paths):
            missed.append(f"{m.name}: {paths[:3]}")
    assert missed == []
    assert sum(m.model_checks for m in CORPUS) >= 0.7 * len(CORPUS)


def _as_api_server_writes(path: str) -> str:
    """`spec.ray.workers.0.replicas` -> `spec.ray.workers[0].replicas`."""
    return re.sub(r"\.(\d+)(?=\.|$)", r"[\1]", path)
