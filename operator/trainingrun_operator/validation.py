"""What is wrong with a TrainingRun, field by field. Pure.

Called by the reconciler (an object that does not parse), the decision core (`spec_problem`: the check the API
server cannot do at admission, `spec.trainer` against the runtime's own RuntimeConfig) and the RayJob builder
(`runtime_config`, the driver's `--config-json`).

`trainingrun_runtime.config` imports only pydantic, so importing it here keeps the operator free of torch and
ray. A problem names its field by its full path (`spec.trainer.grpo.lr: ...`), so the Failed condition does too.
"""

from __future__ import annotations

import dataclasses

import pydantic

from trainingrun_operator import model
from trainingrun_runtime.config import RuntimeConfig

__all__ = ["Problem", "problems", "runtime_config", "spec_problem"]

Loc = tuple[str | int, ...]


@dataclasses.dataclass(frozen=True)
class Problem:
    """One invalid field: where it is from the object's root (`loc`) and pydantic's words for what is wrong."""

    loc: Loc
    message: str

    @property
    def path(self) -> str:
        return ".".join(str(part) for part in self.loc)

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def problems(error: pydantic.ValidationError, prefix: Loc = ()) -> list[Problem]:
    """Every field `error` rejects, in pydantic's order, each located under `prefix`."""
    return [Problem((*prefix, *detail["loc"]), detail["msg"]) for detail in error.errors()]


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


def spec_problem(spec: model.TrainingRunSpec) -> str | None:
    """None if the spec can run, else 'spec.<field path>: <problem>' for the first problem found."""
    try:
        runtime_config(spec)
    except pydantic.ValidationError as exc:
        first = problems(exc)[0]
        return str(Problem(_in_spec(first.loc), first.message))
    return None
