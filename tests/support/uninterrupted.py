"""The uninterrupted run an exact-resume test compares against, run once per session for each configuration's math.

Several tests (test_exact_resume, test_save_on_notice, test_generation_fleet) end a disturbed run and compare its
weights with those of the same configuration trained start to end without a disturbance. What decides those
weights is the configuration's math, `config.config_hash` (the fields a resume may not change), and the number of
trainer workers (the data-parallel ranks round their sums otherwise): not the step limit, the log period, the save
period, the number of generation workers or where they run. So one driver, run
to `STEPS` with one generation worker on a local Ray and a checkpoint at every step, serves every test whose
configuration hashes the same; the `uninterrupted` fixture (tests/conftest.py) keeps one per hash for the session.
Each comparison still asserts that the weights moved (`support.weights`).
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from support import launcher
from trainingrun_runtime import config
from trainingrun_runtime.driver import events
from trainingrun_runtime.storage import layout, verification

STEPS = 12
"""How far a reference trains unless asked for more: the most steps the tests of the first group compare."""


@dataclasses.dataclass(frozen=True)
class Uninterrupted:
    """The reference run of one configuration's math: the weights after each of its steps."""

    run_dir: Path
    weights: Mapping[int, str]
    """step -> weights_sha256 of its verified checkpoint, for every step it trained."""
    rewards: Mapping[int, float]
    """step -> the mean reward of the batch that step trained on."""

    def at(self, step: int) -> str:
        assert step in self.weights, f"the reference trains to step {max(self.weights)}, not {step}"
        return self.weights[step]


class References:
    """The session's reference runs, one per `config.config_hash` and number of trainer workers, each made when
    first asked for."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._made: dict[str, Uninterrupted] = {}

    def __call__(self, conf: Mapping[str, Any], *, steps: int = STEPS) -> Uninterrupted:
        """The uninterrupted run of `conf`'s math (a driver config: `trainer`, `checkpoint`, ...), trained at least
        `steps` steps (one made shorter before is made again, this long)."""
        runtime = config.RuntimeConfig.model_validate(conf)
        key = f"{config.config_hash(runtime)}-w{runtime.trainer.trainer_workers}"
        made = self._made.get(key)
        if made is None or max(made.weights) < steps:
            self._made[key] = made = self._make(conf, key, steps)
        return made

    def of_rayjob(self, rayjob: Mapping[str, Any], *, steps: int) -> Uninterrupted:
        """The uninterrupted run of the configuration a RayJob hands its driver (`--config-json` in its entrypoint):
        what the operator made of the spec, run here on a local Ray."""
        argv = shlex.split(rayjob["spec"]["entrypoint"])
        return self(json.loads(argv[argv.index("--config-json") + 1]), steps=steps)

    def _make(self, conf: Mapping[str, Any], key: str, steps: int) -> Uninterrupted:
        # The trainer as given but for its length and one generation worker, on a local Ray of its own (whatever the
        # test's run attaches to or places its generators on); a checkpoint at every step.
        trainer = json.loads(json.dumps(dict(conf["trainer"])))
        reference = {
            "trainer": {**trainer, "steps": steps, "generationWorkers": 1},
            "checkpoint": {"savePeriod": 1, "keepLast": steps},
        }
        assert config.config_hash(config.RuntimeConfig.model_validate(reference)) in key, "the math changed"
        run = f"ref-{key[:12]}{key[64:]}-{steps}"  # ref-<hash>-w<trainer workers>-<steps>
        proc = launcher.start(run=run, attempt=1, root=self._root, config=reference,
                              event_log=self._root / f"{run}.jsonl")  # fmt: skip
        assert proc.wait(600) == 0, proc.output()[-3000:]
        run_dir = self._root / run
        weights = {step: str(verification.verify(run_dir / layout.step_dirname(step)).weights_sha256)
                   for step in range(1, steps + 1)}  # fmt: skip
        log = events.read(self._root / f"{run}.jsonl")
        finished = [e for e in log if e["event"] == "finished"]
        assert finished and finished[-1]["weights_sha256"] == weights[steps], finished
        rewards = {e["step"]: e["reward"] for e in log if e["event"] == "step_done"}
        return Uninterrupted(run_dir=run_dir, weights=weights, rewards=rewards)
