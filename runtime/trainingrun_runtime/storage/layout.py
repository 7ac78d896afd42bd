"""Where a run's checkpoints live, and the names inside a bundle: the one map of `<root>/<run>/`.

    <root>/<run>/
      owner.json        which attempt of which run may write here (`fence`)
      tmp_step_N.attempt_A/  attempt A's save in progress; never a checkpoint (removed by the next save's begin
                        of attempt A or later, never by an older attempt's: `commit`; `tmp_step_N` from older versions)
      step_N/           a checkpoint iff its manifest verifies (`verification`)
        manifest.json                written last (`manifest`): every other file with its size and checksum
        data_plane/                  TransferQueue's snapshot (`dataplane.snapshot`)
        replay_buffer_metadata.pt    the replay index file: which rows form which group (`dataplane.checkpointer`)
        policy/                      the trainer's weights, optimizer and version (`grpo.trainer`)
        train_dataloader.pt          the loader place and the sampler cursor (`driver.checkpoints`)
      old_step_N/       the previous step_N while step N is saved again (`commit`)
      del_step_N/       a checkpoint being deleted by retention; never a checkpoint (`retention`)
      orphan_step_N/    a step of an abandoned lineage, moved aside; never counted by retention, never loaded

Standard library only.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Final

__all__ = [
    "DATA_PLANE",
    "DEL_PREFIX",
    "MANIFEST",
    "OLD_PREFIX",
    "ORPHAN_PREFIX",
    "POLICY",
    "REPLAY_METADATA",
    "STEP_PREFIX",
    "TMP_PREFIX",
    "TRAIN_DATALOADER",
    "candidates",
    "old_step_of",
    "run_dir",
    "step_dirname",
    "step_of",
    "tmp_attempt_of",
    "tmp_dirname",
]

MANIFEST: Final = "manifest.json"
DATA_PLANE: Final = "data_plane"
REPLAY_METADATA: Final = "replay_buffer_metadata.pt"
POLICY: Final = "policy"
TRAIN_DATALOADER: Final = "train_dataloader.pt"

STEP_PREFIX: Final = "step_"
TMP_PREFIX: Final = "tmp_step_"
OLD_PREFIX: Final = "old_step_"
DEL_PREFIX: Final = "del_step_"
ORPHAN_PREFIX: Final = "orphan_step_"

_NUMBER = r"(0|[1-9][0-9]*)"
_STEP_RE = re.compile(rf"^{STEP_PREFIX}{_NUMBER}$")
_OLD_RE = re.compile(rf"^{OLD_PREFIX}{_NUMBER}$")
_TMP_RE = re.compile(rf"^{TMP_PREFIX}{_NUMBER}\.attempt_{_NUMBER}$")


def step_dirname(step: int) -> str:
    """`step_N` for a step number (ValueError unless it is an int >= 0)."""
    if type(step) is not int or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    return f"{STEP_PREFIX}{step}"


def tmp_dirname(step: int, attempt: int | None) -> str:
    """`tmp_step_N.attempt_A`: where attempt A saves step N (`tmp_step_N` for a writer that names no attempt)."""
    step_dirname(step)  # the same check of the step number
    name = f"{TMP_PREFIX}{step}"
    if attempt is None:
        return name
    if type(attempt) is not int or attempt < 0:
        raise ValueError(f"attempt must be a non-negative int, got {attempt!r}")
    return f"{name}.attempt_{attempt}"


def tmp_attempt_of(name: str) -> int | None:
    """A for a directory named `tmp_step_N.attempt_A`, else None (`tmp_step_N` of older versions included)."""
    m = _TMP_RE.match(name)
    return int(m.group(2)) if m else None


def run_dir(root: str | os.PathLike[str], run: str) -> Path:
    """`<root>/<run>`, refusing run names that are not one plain path component."""
    if not run or run in (".", "..") or "/" in run or "\\" in run or "\x00" in run:
        raise ValueError(f"run name {run!r} is not a single path component")
    return Path(root) / run


def step_of(name: str) -> int | None:
    """N for a directory named `step_N` (no leading zeros), else None."""
    m = _STEP_RE.match(name)
    return int(m.group(1)) if m else None


def old_step_of(name: str) -> int | None:
    """N for a directory named `old_step_N`, else None."""
    m = _OLD_RE.match(name)
    return int(m.group(1)) if m else None


def candidates(run_path: Path) -> tuple[list[tuple[int, Path]], list[tuple[Path, str]]]:
    """Step directories newest first (`old_step_N` only where `step_N` is absent), and what was skipped by name, why."""
    names = sorted(e.name for e in os.scandir(run_path))
    present = set(names)
    found: list[tuple[int, Path]] = []
    skipped: list[tuple[Path, str]] = []
    for name in names:
        path = run_path / name
        if name.startswith(TMP_PREFIX):
            skipped.append((path, "incomplete save (tmp_ directory never renamed)"))
        elif name.startswith(DEL_PREFIX):
            skipped.append((path, "being deleted by retention"))
        elif name.startswith(ORPHAN_PREFIX):
            skipped.append((path, "moved aside: newer than the step an attempt resumed from, and never recorded"))
        elif name.startswith(OLD_PREFIX):
            step = old_step_of(name)
            if step is not None and f"{STEP_PREFIX}{step}" not in present:
                found.append((step, path))  # an interrupted re-save: this is the previous step_N
            else:
                skipped.append((path, "leftover of a re-save (step_N exists)"))
        elif name.startswith(STEP_PREFIX):
            step = step_of(name)
            if step is None:
                skipped.append((path, "not a step_N name"))
            else:
                found.append((step, path))
    found.sort(key=lambda c: c[0], reverse=True)
    return found, skipped
