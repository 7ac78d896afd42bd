"""Checks the API server cannot do at admission: `spec.trainer` against the runtime's own RuntimeConfig. Pure.

`trainingrun_runtime.config` imports only pydantic, so importing it here keeps the operator free of torch and
ray. The problem is reported with the field's full path (`spec.trainer.grpo.lr: ...`) so the Failed condition
names it.
"""

from __future__ import annotations

import pydantic

from trainingrun_operator import model
from trainingrun_runtime.config import RuntimeConfig

__all__ = ["runtime_config", "spec_problem"]


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


def spec_problem(spec: model.TrainingRunSpec) -> str | None:
    """None if the spec can run, else 'spec.<field path>: <problem>' for the first problem found."""
    try:
        runtime_config(spec)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        path = ".".join(str(part) for part in first["loc"])
        if path.startswith("checkpoint"):
            path = path.replace("checkpoint.", "checkpoint.retention.", 1) if "keep" in path else path
        return f"spec.{path}: {first['msg']}"
    return None
