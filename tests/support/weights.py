"""What an exact-resume comparison must also show: that the weights moved between the checkpoints it compares.

Two runs that end with the same weights_sha256 are identical, or both frozen: a learning rate of 0, a trainer that
never steps or a restore that loads nothing would pass an equality test as well as an exact resume does. Each
exact-resume test therefore also hands the weights of its checkpoints, step by step, to `assert_moved`.
"""

from __future__ import annotations

from collections.abc import Mapping


def assert_moved(by_step: Mapping[int, str | None], *, at_least: int = 2) -> None:
    """Every checkpoint in `by_step` (step -> weights_sha256) carries weights of its own: no two steps share them,
    and there are at least `at_least` steps to compare. Fails naming the steps whose weights are the same."""
    assert len(by_step) >= at_least, f"{len(by_step)} checkpoint(s) to compare, at least {at_least} needed: {by_step}"
    missing = sorted(step for step, digest in by_step.items() if not digest)
    assert not missing, f"no weights_sha256 for step(s) {missing}"
    steps_of: dict[str, list[int]] = {}
    for step, digest in sorted(by_step.items()):
        steps_of.setdefault(str(digest), []).append(step)
    same = [steps for steps in steps_of.values() if len(steps) > 1]
    assert not same, f"the weights did not move between steps {same}: a frozen model would pass the comparison"


def recorded(status: Mapping[str, object]) -> dict[int, str | None]:
    """step -> weightsSha256 of every checkpoint a TrainingRun's status records (its history and its latest; the
    newest record of a step wins)."""
    checkpoints = status.get("checkpoints") or {}
    assert isinstance(checkpoints, Mapping), checkpoints
    records = [*(checkpoints.get("history") or []), *([checkpoints["latest"]] if checkpoints.get("latest") else [])]
    return {int(record["step"]): record.get("weightsSha256") for record in records}
