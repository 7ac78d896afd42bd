"""What the full-loop tests read of a run: its recorded checkpoints, its head pod, its run directory on the
volume, the manifests there. Used by tests/e2e (the `Loop` of tests/e2e/conftest.py); the uninterrupted run whose
weights a disrupted run must end with is the session's `uninterrupted` (tests/support/uninterrupted.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import chaos
import provisioner

if TYPE_CHECKING:
    from conftest import Loop  # tests/e2e/conftest.py


def history(status: dict[str, Any]) -> list[dict[str, Any]]:
    return list((status.get("checkpoints") or {}).get("history") or [])


def recorded_by(loop: Loop, namespace: str, run: str, attempt: int) -> list[int]:
    return sorted(c["step"] for c in history(loop.run_status(namespace, run)) if c["attempt"] == attempt)


def head_name(loop: Loop, namespace: str, run: str, attempt: int) -> str:
    pod = loop.wait(
        lambda: _live_head(loop, namespace, run, attempt), timeout=180, what=f"attempt {attempt}'s head pod"
    )
    return str(pod["metadata"]["name"])


def _live_head(loop: Loop, namespace: str, run: str, attempt: int) -> dict[str, Any] | None:
    try:
        return chaos.head_pod(loop.plane, namespace, f"trainingrun.dev/run={run},trainingrun.dev/attempt={attempt}")
    except chaos.ChaosError:
        return None


def run_directory(loop: Loop, namespace: str, claim: str, run: str) -> Path:
    """Where the run's checkpoints land on this machine: <PV hostPath>/<spec.checkpoint.path>/<run> (waits until the
    claim is bound and the driver has made the directory)."""

    def made() -> Path | None:
        try:
            volume = loop.bed.runner.claim_directory(namespace, claim)
        except provisioner.ClaimNotMountable:
            return None  # not bound yet
        return next(iter(volume.glob(f"**/{run}")), None)

    return loop.wait(made, timeout=300, what=f"the checkpoint directory of {run} on the volume")


def manifests(directory: Path) -> dict[int, dict[str, Any]]:
    """step -> manifest of every complete checkpoint (step_N/manifest.json) in the run directory."""
    found = {}
    for path in directory.glob("step_*/manifest.json"):
        try:
            manifest = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        found[int(manifest["step"])] = manifest
    return found


def owner_attempt(directory: Path) -> int | None:
    """The attempt named in the run directory's owner.json (the driver's claim), None before any claim."""
    try:
        return int(json.loads((directory / "owner.json").read_text())["attempt"])
    except (OSError, ValueError, KeyError):
        return None
