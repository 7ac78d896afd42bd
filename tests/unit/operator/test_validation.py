"""What is wrong with a TrainingRun, field by field: every field at once for a person, the first one for the
operator's Failed condition (in pydantic's words, as before), and spec.trainer checked by the runtime's own
RuntimeConfig in both."""

from __future__ import annotations

import copy
import pathlib
from typing import Any

import pytest
import yaml

from trainingrun_operator import model, validation

EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / "manifests" / "examples" / "tiny.yaml"


def tiny(**spec: Any) -> dict[str, Any]:
    """tiny.yaml with spec fields replaced; a value that is a dict is merged one level deep."""
    doc = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    for key, value in spec.items():
        if isinstance(value, dict) and isinstance(doc["spec"].get(key), dict):
            doc["spec"][key] = {**doc["spec"][key], **value}
        else:
            doc["spec"][key] = value
    return dict(doc)


def explained(doc: dict[str, Any]) -> list[str]:
    return [f"{p.path}: {p.explained}" for p in validation.run_problems(doc)]


def test_the_shipped_example_has_no_problem() -> None:
    assert validation.run_problems(tiny()) == []


def test_problems_of_the_model_and_of_the_trainer_come_together() -> None:
    doc = tiny(checkpoint={"savePeriod": 0}, trainer={"steps": -5, "grpo": {"groupSize": 0}})
    assert sorted(explained(doc)) == [
        "spec.checkpoint.savePeriod: must be >= 1 (got 0)",
        "spec.trainer.grpo.groupSize: must be >= 2 (got 0)",
        "spec.trainer.steps: must be >= 1 (got -5)",
    ]


@pytest.mark.parametrize(
    "spec, expected",
    [
        ({"trainer": {"grpo": {"lr": 0}}}, "spec.trainer.grpo.lr: must be > 0.0 (got 0)"),
        ({"trainer": {"task": {"digits": 99}}}, "spec.trainer.task.digits: must be <= 64 (got 99)"),
        (
            {"trainer": {"task": {"kind": "sort"}}},
            "spec.trainer.task.kind: must be one of 'reverse', 'copy' or 'increment' (got \"sort\")",
        ),
        (
            {"imagePullPolicy": "Sometimes"},
            "spec.imagePullPolicy: must be one of 'Always', 'IfNotPresent' or 'Never' (got \"Sometimes\")",
        ),
        (
            {"trainer": {"seed": "zero"}},
            'spec.trainer.seed: must be a valid integer, unable to parse string as an integer (got "zero")',
        ),
        ({"checkpoint": {"pvc": {}}}, "spec.checkpoint.pvc.claimName: required, but missing"),
        (
            {"trainer": {"model": {"dModel": 30, "nHeads": 4}}},
            "spec.trainer.model: n_heads (4) must divide d_model (30)",
        ),
        ({"trainer": {"grpo": {"lrr": 0.1}}}, "spec.trainer.grpo.lrr: unknown field (did you mean lr?)"),
        (
            {"checkpoint": {"retention": {"keepLast": 3, "x": 1}}},
            "spec.checkpoint.retention.x: unknown field; allowed here: keepLast, keepEvery",
        ),
        ({"trainer": "steps: 10"}, 'spec.trainer: must be a valid dictionary (got "steps: 10")'),
    ],
)
def test_each_problem_says_what_is_allowed_and_what_was_given(spec: dict[str, Any], expected: str) -> None:
    assert explained(tiny(**spec)) == [expected]


def test_the_operator_still_reports_the_first_problem_in_pydantics_words() -> None:
    doc = tiny(trainer={"steps": -5, "grpo": {"groupSize": 0}})
    spec = model.TrainingRunSpec.model_validate(doc["spec"])
    assert validation.spec_problem(spec) == "spec.trainer.grpo.groupSize: Input should be greater than or equal to 2"
    assert validation.spec_problem(model.TrainingRunSpec.model_validate(tiny()["spec"])) is None
