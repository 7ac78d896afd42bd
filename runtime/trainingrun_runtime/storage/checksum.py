"""The file checksums of a bundle: which algorithm each manifest format uses, and a hasher for it.

    format_version 1   "sha256"   hashlib's SHA-256          written by earlier versions; still verified
    format_version 2   "blake3"   the `blake3` package        written now

A `files` entry of the manifest carries its checksum under the algorithm's name (`{"size": n, "blake3": hex}`).
BLAKE3 hashes several times as fast per core as SHA-256 (`blake3_in_memory_s` and `sha256_in_memory_s` in
`bench/bench_dataplane.py`), and can split one large input over several threads. `weights_sha256` is not a file
checksum (it identifies the policy weights across runs) and stays SHA-256 (`grpo.trainer`).

This is the only module that imports `blake3` (import-linter's "protected" contract checks it); everything else,
the storage units' staged writes included, makes its hashers here.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from typing import Final, Protocol

import blake3

__all__ = ["ALGORITHMS", "CURRENT", "Hasher", "blake3_of_bytes", "blake3_of_mapped_file", "is_hex_digest", "new"]

CURRENT: Final = "blake3"
"""The algorithm this version writes."""

ALGORITHMS: Final[Mapping[int, str]] = {1: "sha256", 2: "blake3"}
"""Manifest `format_version` -> the algorithm of its file checksums."""

_HEX: Final = re.compile(r"^[0-9a-f]{64}$")


class Hasher(Protocol):
    """What both algorithms' hashers offer (hashlib's and blake3's incremental interface)."""

    def update(self, data: bytes | memoryview, /) -> object: ...

    def hexdigest(self) -> str: ...


def new(algorithm: str) -> Hasher:
    """An empty hasher for `algorithm`, on one thread; ValueError for an unknown algorithm."""
    if algorithm == "blake3":
        return blake3.blake3()
    if algorithm == "sha256":
        return hashlib.sha256()
    raise ValueError(f"unknown checksum algorithm {algorithm!r} (known: {sorted(set(ALGORITHMS.values()))})")


def blake3_of_bytes(data: bytes) -> str:
    """BLAKE3 (hex) of `data`: the manifest's own hash (`manifestBlake3` in the run's status)."""
    return blake3.blake3(data).hexdigest()


def blake3_of_mapped_file(path: str | os.PathLike[str], *, threads: int) -> str:
    """BLAKE3 (hex) of a whole file, mapped rather than read, its tree split over `threads` threads: for a large
    file already in the page cache. A read error while mapped is a SIGBUS, not an OSError, so cold files that
    verification reads are read instead (`files.hash_file`)."""
    h = blake3.blake3(max_threads=max(1, threads))
    h.update_mmap(os.fspath(path))
    return h.hexdigest()


def is_hex_digest(value: object) -> bool:
    """Whether `value` is a 256-bit digest in lowercase hex (both algorithms' form)."""
    return isinstance(value, str) and _HEX.match(value) is not None
