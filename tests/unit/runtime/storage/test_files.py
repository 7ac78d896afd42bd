"""The file operations of a bundle: hashing in chunks through reused buffers, BLAKE3 (format 2) or SHA-256 (the
checksum of format 1 bundles)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import blake3
import pytest

from trainingrun_runtime.storage import files
from trainingrun_runtime.storage.manifest import FileEntry


def test_hash_file_reads_large_files_in_chunks(tmp_path: Path) -> None:
    data = os.urandom(files.CHUNK * 2 + 12345)
    p = tmp_path / "big"
    p.write_bytes(data)
    assert files.hash_file(p) == FileEntry(size=len(data), digest=blake3.blake3(data).hexdigest(), algorithm="blake3")


@pytest.mark.parametrize("size", [0, 1, 4096, files.CHUNK - 1, files.CHUNK])
def test_hash_file_gives_size_and_blake3_of_small_and_boundary_sized_files(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    p = tmp_path / "f"
    p.write_bytes(data)
    assert files.hash_file(p) == FileEntry(size=size, digest=blake3.blake3(data).hexdigest())
    assert files.hash_file(p) == files.hash_file(p)  # a reused buffer carries nothing over


def test_hash_file_gives_the_sha256_a_format_1_manifest_carries(tmp_path: Path) -> None:
    data = os.urandom(files.CHUNK + 7)
    p = tmp_path / "f"
    p.write_bytes(data)
    entry = files.hash_file(p, "sha256")
    assert entry == FileEntry(size=len(data), digest=hashlib.sha256(data).hexdigest(), algorithm="sha256")
    assert entry.to_dict() == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


@pytest.mark.parametrize("size", [0, 3, files.CHUNK * 3 + 5])
def test_hash_file_on_several_threads_gives_the_same_blake3(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    p = tmp_path / "f"
    p.write_bytes(data)
    assert files.hash_file(p, threads=2) == files.hash_file(p) == FileEntry(size, blake3.blake3(data).hexdigest())


def test_sha256_ignores_threads_and_reads_the_file(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"format 1")
    assert files.hash_file(p, "sha256", threads=2).digest == hashlib.sha256(b"format 1").hexdigest()
