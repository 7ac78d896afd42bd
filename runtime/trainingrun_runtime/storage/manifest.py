"""`step_N/manifest.json`: what a checkpoint holds, written last; a step directory is a checkpoint only if it verifies.

    {"format_version": 2, "run": str, "step": int, "attempt": int, "config_hash": str, "created": RFC 3339,
     "files": {relpath: {"size": int, "blake3": hex}},          every file of the bundle but the manifest
     "replay_digest": str, "replay_mode": "authoritative", "weights_sha256": hex | null, "extra": {...}}

Format 1 is the same with `{"size": int, "sha256": hex}` per file; this version writes format 2 and reads both
(`checksum.ALGORITHMS`). `weights_sha256` is SHA-256 in both. Written sorted and indented, NaN-free; read back
strictly: unknown keys, a missing key, a wrong type, an unsafe path, a checksum of another algorithm than the
format's, or an unknown format version are `CheckpointCorrupt` naming the file and the key. Standard library
and `checksum` only.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, Final

from trainingrun_runtime.digest import canonical_json
from trainingrun_runtime.errors import CheckpointCorrupt
from trainingrun_runtime.storage import checksum
from trainingrun_runtime.storage.layout import MANIFEST

__all__ = ["FORMAT_VERSION", "FileEntry", "Manifest", "check_entry", "check_relpath"]

FORMAT_VERSION: Final = 2
"""The format this version writes; every format in `checksum.ALGORITHMS` is read."""


@dataclasses.dataclass(frozen=True)
class FileEntry:
    """One file of a bundle: its size and its checksum, hex, under `algorithm` (the manifest's format fixes which)."""

    size: int
    digest: str
    algorithm: str = checksum.CURRENT

    def to_dict(self) -> dict[str, Any]:
        """The manifest's JSON for this file: `{"size": n, "<algorithm>": hex}`."""
        return {"size": self.size, self.algorithm: self.digest}


@dataclasses.dataclass(frozen=True)
class Manifest:
    """The content of `step_N/manifest.json`."""

    format_version: int
    run: str
    step: int
    attempt: int
    config_hash: str
    created: str
    """RFC 3339 UTC time of the commit."""
    files: Mapping[str, FileEntry]
    """Every file in the bundle except manifest.json: POSIX relative path -> size and checksum."""
    replay_digest: str
    replay_mode: str
    weights_sha256: str | None = None
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object written to disk."""
        return {
            "format_version": self.format_version,
            "run": self.run,
            "step": self.step,
            "attempt": self.attempt,
            "config_hash": self.config_hash,
            "created": self.created,
            "files": {k: v.to_dict() for k, v in sorted(self.files.items())},
            "replay_digest": self.replay_digest,
            "replay_mode": self.replay_mode,
            "weights_sha256": self.weights_sha256,
            "extra": dict(self.extra),
        }

    def to_json(self) -> bytes:
        """Sorted, indented, NaN-free JSON (raises DigestError naming the field if `extra` holds a non-JSON value)."""
        data = self.to_dict()
        canonical_json(data)  # validation only: names the bad field
        return (json.dumps(data, sort_keys=True, indent=2, allow_nan=False) + "\n").encode("ascii")

    @classmethod
    def from_json(cls, raw: bytes, *, where: str = MANIFEST) -> Manifest:
        """Parse and validate manifest bytes; raise CheckpointCorrupt prefixed with `where`."""
        try:
            data = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
        except (UnicodeDecodeError, ValueError) as e:
            raise CheckpointCorrupt(f"{where}: not valid JSON ({e})") from None
        return cls.from_dict(data, where=where)

    @classmethod
    def from_dict(cls, data: object, *, where: str = MANIFEST) -> Manifest:
        """Validate a parsed manifest object; raise CheckpointCorrupt naming the bad key."""
        if not isinstance(data, dict):
            raise CheckpointCorrupt(f"{where}: manifest is a JSON {type(data).__name__}, not an object")
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise CheckpointCorrupt(f"{where}: unknown manifest keys {unknown}")
        version = _get(data, "format_version", int, where)
        algorithm = checksum.ALGORITHMS.get(version)
        if algorithm is None:
            raise CheckpointCorrupt(
                f"{where}: format_version {version} is not supported (this reader: {sorted(checksum.ALGORITHMS)})"
            )
        files = {
            rel: check_entry(rel, entry, where, algorithm=algorithm)
            for rel, entry in _get(data, "files", dict, where).items()
        }
        if "weights_sha256" not in data:
            raise CheckpointCorrupt(f"{where}: required key 'weights_sha256' is missing")
        weights = data["weights_sha256"]
        if weights is not None and not isinstance(weights, str):
            raise CheckpointCorrupt(f"{where}: weights_sha256 must be a string or null, got {weights!r}")
        step = _get(data, "step", int, where)
        attempt = _get(data, "attempt", int, where)
        if step < 0 or attempt < 0:
            raise CheckpointCorrupt(f"{where}: step and attempt must be >= 0 (step={step}, attempt={attempt})")
        return cls(
            format_version=version,
            run=_get(data, "run", str, where),
            step=step,
            attempt=attempt,
            config_hash=_get(data, "config_hash", str, where),
            created=_get(data, "created", str, where),
            files=files,
            replay_digest=_get(data, "replay_digest", str, where),
            replay_mode=_get(data, "replay_mode", str, where),
            weights_sha256=weights,
            extra=_get(data, "extra", dict, where),
        )


def check_entry(rel: object, entry: object, where: str, *, algorithm: str = checksum.CURRENT) -> FileEntry:
    """One `files` entry, checked: a safe relative path, a size >= 0 and a hex checksum under `algorithm` (the
    format's); CheckpointCorrupt otherwise."""
    check_relpath(rel, where)
    if not isinstance(entry, dict) or set(entry) != {"size", algorithm}:
        raise CheckpointCorrupt(f"{where}: files[{rel!r}] must be {{size, {algorithm}}}, got {entry!r}")
    size, digest = entry["size"], entry[algorithm]
    if type(size) is not int or size < 0 or not checksum.is_hex_digest(digest):
        raise CheckpointCorrupt(f"{where}: files[{rel!r}] has an invalid size or {algorithm}: {entry!r}")
    return FileEntry(size=size, digest=digest, algorithm=algorithm)


def check_relpath(rel: object, where: str) -> None:
    """CheckpointCorrupt unless `rel` is a plain relative POSIX path inside the bundle (and not the manifest)."""
    ok = (
        isinstance(rel, str)
        and rel != ""
        and not rel.startswith("/")
        and "\\" not in rel
        and "\x00" not in rel
        and all(part not in ("", ".", "..") for part in rel.split("/"))
        and rel != MANIFEST
    )
    if not ok:
        raise CheckpointCorrupt(f"{where}: files has an unsafe or reserved path {rel!r}")


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not valid JSON")


def _get(data: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in data:
        raise CheckpointCorrupt(f"{where}: required key {key!r} is missing")
    value = data[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise CheckpointCorrupt(f"{where}: {key!r} must be {kind.__name__}, got {value!r}")
    return value
