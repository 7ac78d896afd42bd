"""TRL (or any Hugging Face `Trainer`) on the SDK's contract: one callback, and `resume_from_checkpoint`.

    run = sdk.attach()
    trainer = GRPOTrainer(..., args=GRPOConfig(output_dir=..., save_strategy="no", ...),
                          callbacks=[TrainingRunCallback(run)])
    resume = run.resume_dir()
    trainer.train(resume_from_checkpoint=str(resume) if resume is not None else None)
    if run.notice:
        run.stop()                 # the notice's checkpoint was saved: exit PREEMPTED
    run.finish(trainer.state.global_step)

What the callback does, at the Trainer's hooks:

    on_step_end   should_save(global_step): every savePeriod steps, once on the notice, and the last step ->
                  control.should_save;
                  on the notice, control.should_training_stop too (train() returns after that save)
    on_save       the Trainer wrote output_dir/checkpoint-N (weights, optimizer, scheduler, RNG, trainer_state.json):
                  its files move into run.checkpoint(N), which commits and records it; the emptied directory goes
    on_log        run.report(global_step, ...): the logged numbers, `reward` first, names made identifiers
                  (`rewards/fn/mean` -> `rewards_fn_mean`), at most `contract.METRICS_MAX` besides reward

A recorded step is the Trainer's own checkpoint directory, plus the SDK's manifest, so `resume_from_checkpoint`
takes it as it is. Keep the Trainer's own save schedule off (`save_strategy="no"`), so that every save is one the
operator records, and put `output_dir` on the checkpoint volume so the move is a rename.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from trainingrun_runtime import contract
from trainingrun_runtime.sdk.attached import Run

__all__ = ["TrainingRunCallback", "metric_name"]

_FIRST = ("reward", "loss", "kl", "entropy", "learning_rate", "grad_norm")
"""The logged figures a report keeps first when a log holds more than a report carries."""


def metric_name(key: str) -> str:
    """A logged key as a report's metric name: every other character an underscore, at most 64 of them."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", key)
    return ("_" + name if name[:1].isdigit() else name)[:64] or "_"


class TrainingRunCallback(TrainerCallback):
    """Turns a Hugging Face Trainer's saves into recorded checkpoints, saves on the notice, reports each log step."""

    def __init__(self, run: Run) -> None:
        self.run = run

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        if self.run.should_save(state.global_step) or state.global_step >= state.max_steps > 0:  # and the last one
            control.should_save = True
        if self.run.notice is not None:
            control.should_training_stop = True
        return control

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        step = state.global_step
        source = Path(str(args.output_dir)) / f"checkpoint-{step}"
        with self.run.checkpoint(step, final=step >= state.max_steps > 0) as directory:
            for entry in sorted(source.iterdir()):
                shutil.move(entry, directory / entry.name)
        source.rmdir()
        return control

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> TrainerControl:
        figures = {
            metric_name(key): float(value)
            for key, value in (logs or {}).items()
            if isinstance(value, int | float) and not isinstance(value, bool)
        }
        kept = sorted(figures, key=lambda name: (_FIRST.index(name) if name in _FIRST else len(_FIRST), name))
        chosen = {name: figures[name] for name in kept[: contract.METRICS_MAX + ("reward" in figures)]}
        self.run.report(state.global_step, **chosen)
        return control
