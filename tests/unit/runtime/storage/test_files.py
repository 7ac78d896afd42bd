"""The file operations of a bundle: hashing in chunks through reused buffers."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from trainingrun_runtime.storage import files


def test_hash_file_reads_large_files_in_chunks(tmp_path: Path) -> None:
    data = os.urandom(files.CHUNK * 2 + 12345)
    p = tmp_path / "big"
    p.write_bytes(data)
    assert files.hash_file(p) == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


@pytest.mark.parametrize("size", [0, 1, 4096, files.CHUNK - 1, files.CHUNK])
def test_hash_file_gives_size_and_sha256_of_small_and_boundary_sized_files(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    p = tmp_path / "f"
    p.write_bytes(data)
    assert files.hash_file(p) == {"size": size, "sha256": hashlib.sha256(data).hexdigest()}
    assert files.hash_file(p) == files.hash_file(p)  # a reused buffer carries nothing over
