"""Small bundles written through the real commit, for the storage tests: known contents, a fixed clock; and the
same bundle as an earlier version wrote it (manifest format 1, a SHA-256 per file)."""

from __future__ import annotations

import datetime
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import blake3

from trainingrun_runtime.digest import sha256_hex
from trainingrun_runtime.storage.commit import BundleWriter
from trainingrun_runtime.storage.layout import DATA_PLANE, MANIFEST, REPLAY_METADATA

RUN = "demo"
T0 = datetime.datetime(2025, 1, 2, 3, 4, 5, 678000, tzinfo=datetime.UTC)


def contents(step: int, tag: str = "") -> dict[str, bytes]:
    """The files of step `step`: a data plane, an index file, policy weights, a loader place."""
    return {
        f"{DATA_PLANE}/storage_0.pkl": f"rows of step {step}{tag}".encode() * 100,
        f"{DATA_PLANE}/controller.pkl": f"controller {step}{tag}".encode(),
        REPLAY_METADATA: f"index {step}{tag}".encode(),
        "policy/weights.pt": bytes(range(256)) * 4,
        "train_dataloader.pt": b"loader",
    }


def save(
    root: Path,
    step: int,
    files: dict[str, bytes] | None = None,
    *,
    on_stage: Callable[[str], None] | None = None,
    attempt: int = 1,
) -> Path:
    """Commit `files` (default: `contents(step)`) as step `step` of run RUN under `root`; returns step_N."""
    writer = BundleWriter(root, RUN, on_stage=on_stage, now=lambda: T0)
    pending = writer.begin(step)
    for rel, data in (files if files is not None else contents(step)).items():
        p = pending.path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return pending.commit(
        attempt=attempt,
        config_hash="c" * 64,
        replay_digest=sha256_hex({"step": step}),
        replay_mode="authoritative",
        weights_sha256="w" * 3,
        extra={"loader": {"epoch": 0, "index": step}},
    )


def save_as(root: Path, run: str, step: int, *, attempt: int, run_uid: str) -> Path:
    """Commit `contents(step)` as step `step` of `run`, written by attempt `attempt` of run uid `run_uid`."""
    pending = BundleWriter(root, run, attempt=attempt, run_uid=run_uid, now=lambda: T0).begin(step)
    for rel, data in contents(step, f" of attempt {attempt}").items():
        p = pending.path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return pending.commit(
        attempt=attempt, config_hash="c" * 64, replay_digest=sha256_hex({"step": step}), replay_mode="authoritative"
    )


def as_format_1(step_dir: Path) -> Path:
    """Rewrite a committed step's manifest as versions before BLAKE3 wrote it: `format_version` 1 and a SHA-256
    per file (hashed here with hashlib, not through the code under test); returns `step_dir`."""
    raw = json.loads((step_dir / MANIFEST).read_text())
    raw["format_version"] = 1
    raw["files"] = {
        rel: {"size": entry["size"], "sha256": hashlib.sha256((step_dir / rel).read_bytes()).hexdigest()}
        for rel, entry in raw["files"].items()
    }
    (step_dir / MANIFEST).write_text(json.dumps(raw, sort_keys=True, indent=2) + "\n")
    return step_dir


def resign(step_dir: Path) -> Path:
    """What anyone who can write the volume can do to a tampered step: rewrite its manifest's BLAKE3 of every file
    (hashed here with the blake3 package, not through the code under test) to match the files as they now are;
    returns `step_dir`."""
    raw = json.loads((step_dir / MANIFEST).read_text())
    raw["files"] = {
        rel: {
            "size": (step_dir / rel).stat().st_size,
            "blake3": blake3.blake3((step_dir / rel).read_bytes()).hexdigest(),
        }
        for rel in raw["files"]
    }
    (step_dir / MANIFEST).write_text(json.dumps(raw, sort_keys=True, indent=2) + "\n")
    return step_dir


def flip_middle_byte(path: Path) -> None:
    """Damage a file as a bad disk block would: its middle byte inverted, its size unchanged."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
