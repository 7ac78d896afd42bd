"""A data-plane checkpoint in one call, for tests: the checkpointer's calls in the order the controller makes them.

`driver.checkpoints.Checkpoints.save` does `begin`, writes the policy, `snapshot` (the barrier cut), then `commit`
in the background; tests without a trainer make the same three calls here, in sequence.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from trainingrun_runtime.dataplane import checkpointer


async def save(
    saver: checkpointer.DataPlaneCheckpointer,
    step: int,
    *,
    attempt: int,
    config_hash: str,
    capture: Callable[[], Mapping[str, Any]] | None = None,
    weights_sha256: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> tuple[Path, checkpointer.Snapshot]:
    """`begin`, `snapshot` and `commit`; returns the committed `step_N` and what the cut captured."""
    pending = saver.begin(step)
    snap = await pending.snapshot(capture)
    path = await asyncio.to_thread(
        pending.commit, attempt=attempt, config_hash=config_hash, weights_sha256=weights_sha256, extra=extra
    )
    return path, snap
