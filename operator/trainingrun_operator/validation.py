"""What is wrong with a TrainingRun, field by field. Pure.

Called by the reconciler (an object that does not parse), the decision core (`spec_problem`: the check the API
server cannot do at admission, `spec.trainer` against the runtime's own RuntimeConfig), the RayJob builder
(`runtime_config`, the driver's `--config-json`) and `trainingrun run` (`run_problems`: every invalid field of a
TrainingRun file at once, the model's and RuntimeConfig's).

A problem names its field by its full path (`spec.trainer.grpo.lr`). It carries two texts: pydantic's message,
which the operator's Failed condition shows (`str(problem)`), and `explained`, what a person at a terminal
needs: the rule and the value given (`must be >= 1 (got -5)`), or for an unknown field the nearest known name.

`trainingrun_runtime.config` imports only pydantic, so importing it here keeps the operator free of torch and
ray.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from collections.abc import Mapping
from typing import Any

import pydantic
import pydantic_core

from trainingrun_operator import model
from trainingrun_runtime.config import RuntimeConfig

__all__ = ["Problem", "problems", "run_problems", "runtime_config", "spec_problem"]

Loc = tuple[str | int, ...]
_BOUNDS = {
    "greater_than_equal": (">=", "ge"),
    "greater_than": (">", "gt"),
    "less_than_equal": ("<=", "le"),
    "less_than": ("<", "lt"),
}


@dataclasses.dataclass(frozen=True)
class Problem:
    """One invalid field: where it is from the object's root (`loc`), pydantic's words, and the rule explained."""

    loc: Loc
    message: str
    explained: str = ""

    @property
    def path(self) -> str:
        return ".".join(str(part) for part in self.loc)

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def problems(
    error: pydantic.ValidationError, prefix: Loc = (), root: type[pydantic.BaseModel] | None = None
) -> list[Problem]:
    """Every field `error` rejects, in pydantic's order, each located under `prefix`. `root`: the model that
    was validated, to name the fields allowed where an unknown one was found."""
    return [Problem((*prefix, *detail["loc"]), detail["msg"], _explain(detail, root)) for detail in error.errors()]


def runtime_config(spec: model.TrainingRunSpec) -> RuntimeConfig:
    """The driver's `--config-json` value: spec.trainer verbatim plus the checkpoint settings."""
    return RuntimeConfig.model_validate(
        {
            "trainer": spec.trainer,
            "checkpoint": {
                "savePeriod": spec.checkpoint.save_period,
                "keepLast": spec.checkpoint.retention.keep_last,
                "keepEvery": spec.checkpoint.retention.keep_every,
            },
        }
    )


def _in_spec(loc: Loc) -> Loc:
    """A RuntimeConfig location as a spec path: the retention settings sit under `checkpoint.retention`."""
    if loc[:1] == ("checkpoint",) and loc[1:2] in (("keepLast",), ("keepEvery",)):
        return ("spec", "checkpoint", "retention", *loc[1:])
    return ("spec", *loc)


def _spec_problems(spec: model.TrainingRunSpec) -> list[Problem]:
    """Every problem of spec.trainer (and the checkpoint settings) against the runtime's RuntimeConfig."""
    try:
        runtime_config(spec)
    except pydantic.ValidationError as exc:
        return [dataclasses.replace(p, loc=_in_spec(p.loc)) for p in problems(exc, root=RuntimeConfig)]
    return []


def spec_problem(spec: model.TrainingRunSpec) -> str | None:
    """None if the spec can run, else 'spec.<field path>: <problem>' for the first problem found."""
    found = _spec_problems(spec)
    return str(found[0]) if found else None


def run_problems(obj: Mapping[str, Any]) -> list[Problem]:
    """Every invalid field of a TrainingRun object, at once: the model (the CRD's mirror) and spec.trainer against
    RuntimeConfig, as the operator checks them. A spec the model rejects still has its trainer checked."""
    try:
        run = model.TrainingRun.model_validate(obj)
    except pydantic.ValidationError as exc:
        found = problems(exc, root=model.TrainingRun)
        spec = obj.get("spec")
        trainer = spec.get("trainer") if isinstance(spec, Mapping) else None
        if isinstance(trainer, Mapping):
            try:
                RuntimeConfig.model_validate({"trainer": trainer})
            except pydantic.ValidationError as trainer_exc:
                found += problems(trainer_exc, ("spec",), root=RuntimeConfig)
        return found
    return _spec_problems(run.spec)


# -------------------------------------------------------------------------------- for a person to read


def _explain(detail: pydantic_core.ErrorDetails, root: type[pydantic.BaseModel] | None) -> str:
    """The rule a value broke, with the value given: `must be >= 1 (got -5)`."""
    kind, ctx, given = detail["type"], detail.get("ctx") or {}, detail.get("input")
    if kind == "missing":
        return "required, but missing"
    if kind == "extra_forbidden":
        return _unknown_field(detail["loc"], root)
    if kind == "value_error":
        return str(ctx.get("error", detail["msg"]))  # the model's own sentence
    if kind in _BOUNDS:
        sign, bound = _BOUNDS[kind]
        return f"must be {sign} {ctx[bound]} (got {_shown(given)})"
    if kind == "literal_error":
        expected = str(ctx["expected"])
        choice = "one of " if " or " in expected else ""
        return f"must be {choice}{expected} (got {_shown(given)})"
    text = detail["msg"]
    for said, meant in (("Input should be", "must be"), ("String should", "must"), ("List should", "must")):
        if text.startswith(said):
            text = meant + text[len(said) :]
    return f"{text} (got {_shown(given)})"


def _shown(value: Any) -> str:
    """A value as the user wrote it in YAML, briefly."""
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    text = json.dumps(value) if isinstance(value, (str, int, float, bool)) or value is None else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _unknown_field(loc: Loc, root: type[pydantic.BaseModel] | None) -> str:
    """`unknown field (did you mean savePeriod?)`, else the fields allowed there."""
    where = _model_at(root, loc[:-1]) if root is not None else None
    if where is None:
        return "unknown field"
    allowed = [field.alias or name for name, field in where.model_fields.items()]
    close = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.6)
    if close:
        return f"unknown field (did you mean {close[0]}?)"
    return f"unknown field; allowed here: {', '.join(allowed)}"


def _model_at(root: type[pydantic.BaseModel], loc: Loc) -> type[pydantic.BaseModel] | None:
    """The model that validates the object at `loc` under `root` (list indexes skipped); None past a plain dict."""
    current: Any = root
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, pydantic.BaseModel)):
            return None
        field = next((f for name, f in current.model_fields.items() if part in (name, f.alias)), None)
        if field is None:
            return None
        current = _item_type(field.annotation)
    return current if isinstance(current, type) and issubclass(current, pydantic.BaseModel) else None


def _item_type(annotation: Any) -> Any:
    """X for X, X | None and list[X]."""
    while True:
        origin, args = typing.get_origin(annotation), [a for a in typing.get_args(annotation) if a is not type(None)]
        if origin in (list, typing.Union, types.UnionType) and len(args) == 1:
            annotation = args[0]
        else:
            return annotation
