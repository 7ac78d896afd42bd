"""Retention: keep the newest `keep_last` checkpoints, every `keep_every`-th and the protected ones; delete the rest.

The newest valid checkpoint is never deleted, whatever the arguments. Deleting renames `step_N` to `del_step_N`
first, so a crash mid-delete never leaves a partial `step_N`.

Only the current lineage counts (`Lineage`): the steps at or below the one this attempt resumed from, and the
steps it wrote itself. A step on disk above the resume point that this attempt did not write (an older lineage's,
left by pinning `resume.step` below it, a changed `savePeriod`, a stale notice checkpoint) is neither counted
nor deleted: counting it would make the step just committed look old enough to delete. Standard library only.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Collection
from pathlib import Path

from trainingrun_runtime.errors import CheckpointCorrupt
from trainingrun_runtime.storage import files, layout, verification

__all__ = ["Lineage", "RetentionResult", "apply_retention", "set_aside"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Lineage:
    """The steps one attempt's retention may count: those at or below `resumed_from`, and those in `written`."""

    resumed_from: int | None
    """The step this attempt restored (None: a fresh start, so no step before it is its lineage's)."""
    written: frozenset[int]
    """The steps this attempt committed."""

    def __contains__(self, step: object) -> bool:
        if step in self.written:
            return True
        return isinstance(step, int) and self.resumed_from is not None and step <= self.resumed_from


@dataclasses.dataclass(frozen=True)
class RetentionResult:
    """What `apply_retention` kept and deleted (paths of step_N directories, oldest first).

    `kept` includes the steps outside the lineage, which are never deleted; `outside` lists those alone.
    """

    kept: list[Path]
    deleted: list[Path]
    outside: list[Path] = dataclasses.field(default_factory=list)


def apply_retention(
    root: str | os.PathLike[str],
    run: str,
    keep_last: int,
    keep_every: int | None = None,
    *,
    verified: str | os.PathLike[str] | None = None,
    protect: Collection[int] = (),
    lineage: Lineage | None = None,
    guard: Callable[[str], None] | None = None,
) -> RetentionResult:
    """Keep the newest `keep_last` valid checkpoints and every step divisible by `keep_every`; delete the rest.

    Steps in `protect` are kept too (the driver passes the step the operator would resume from). With a
    `lineage`, only its steps (and the `verified` one) are counted or deleted; None counts every step on disk
    (a directory that one lineage has written throughout). `guard` (the fence) runs right before anything is
    deleted, after the slow part (verification), and may raise to stop it.

    The newest valid checkpoint is found like `discover` does (full checksums, newest first),
    except that the step directory passed as `verified` (the path `commit()` just returned,
    hashed moments ago) is trusted without re-reading it. Older checkpoints are classified by
    the cheap check (`verification.looks_valid`). Invalid step directories newer than the newest
    valid one are kept (evidence; discovery skips them); invalid ones older than it can never be
    chosen and are deleted. Only `step_N` directories are considered.
    """
    if type(keep_last) is not int or keep_last < 0:
        raise ValueError(f"keep_last must be an int >= 0, got {keep_last!r}")
    if keep_every is not None and (type(keep_every) is not int or keep_every < 1):
        raise ValueError(f"keep_every must be None or an int >= 1, got {keep_every!r}")
    run_path = layout.run_dir(root, run)
    if not run_path.is_dir():
        return RetentionResult(kept=[], deleted=[])
    trusted = None if verified is None else Path(verified).resolve()
    on_disk = sorted(
        ((s, run_path / n) for n in os.listdir(run_path) if (s := layout.step_of(n)) is not None), reverse=True
    )
    steps = [(s, p) for s, p in on_disk if lineage is None or s in lineage or p.resolve() == trusted]
    outside = [p for s, p in reversed(on_disk) if (s, p) not in steps]
    if outside:
        log.info("retention in %s: %s not of this lineage, not counted", run_path, [p.name for p in outside])
    newest = _newest_valid(steps, run, trusted)
    if newest is None:
        return RetentionResult(kept=[p for _, p in reversed(on_disk)], deleted=[], outside=outside)
    valid = [s for s, p in steps if s == newest or (s < newest and verification.looks_valid(p, run))]
    keep = set(valid[: max(keep_last, 1)]) | set(protect)
    if keep_every is not None:
        keep |= {s for s in valid if s % keep_every == 0}
    doomed = [(s, p) for s, p in reversed(steps) if s not in keep and s < newest]
    if doomed and guard is not None:
        guard("apply retention")  # it could delete the step a newer attempt restored from
    _delete(run_path, doomed)
    gone = {s for s, _ in doomed}
    return RetentionResult(
        kept=[p for s, p in reversed(on_disk) if s not in gone], deleted=[p for _, p in doomed], outside=outside
    )


def set_aside(root: str | os.PathLike[str], run: str, *, above: int, recorded: Collection[int]) -> list[int]:
    """Move each `step_N` newer than `above` (the step an attempt resumes from) that is not in `recorded` (the
    steps the status records) to `orphan_step_N`, fsync the run directory; returns the steps moved, oldest first.

    Such a step belongs to no lineage the operator knows (saved by an ended attempt after its last recorded
    report, or left above a pinned `resume.step`): set aside, it is never counted by retention, never chosen by
    discovery, and never deleted. A second orphan of the same step takes the next free `orphan_step_N.K`.
    """
    run_path = layout.run_dir(root, run)
    if not run_path.is_dir():
        return []
    keep = set(recorded)
    moved = sorted(s for n in os.listdir(run_path) if (s := layout.step_of(n)) is not None and s > above)
    moved = [s for s in moved if s not in keep]
    for step in moved:
        target = run_path / f"{layout.ORPHAN_PREFIX}{step}"
        k = 1
        while target.exists():
            target, k = run_path / f"{layout.ORPHAN_PREFIX}{step}.{k}", k + 1
        os.rename(run_path / layout.step_dirname(step), target)
    if moved:
        files.fsync_dir(run_path)
        log.warning("%s: set aside %s (newer than step %d, never recorded)", run_path, moved, above)
    return moved


def _newest_valid(steps: list[tuple[int, Path]], run: str, trusted: Path | None) -> int | None:
    """The newest step (of `steps`, newest first) that verifies in full, or is the `trusted` one."""
    for s, p in steps:
        if p.resolve() == trusted:
            return s
        try:
            verification.verify(p, run=run)
        except CheckpointCorrupt as e:
            log.warning("retention: %s is not a valid checkpoint: %s", p, e)
            continue
        return s
    return None


def _delete(run_path: Path, doomed: list[tuple[int, Path]]) -> None:
    """Rename each to `del_step_N`, fsync the run directory, then remove them."""
    if not doomed:
        return
    for s, p in doomed:
        trash = run_path / f"{layout.DEL_PREFIX}{s}"
        if trash.exists():
            files.remove_tree(trash)
        os.rename(p, trash)
    files.fsync_dir(run_path)
    for s, _ in doomed:
        files.remove_tree(run_path / f"{layout.DEL_PREFIX}{s}")
    log.info("retention in %s: deleted %s", run_path, [p.name for _, p in doomed])
