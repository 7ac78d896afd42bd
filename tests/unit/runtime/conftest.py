"""Fixtures shared by the runtime's unit tests."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    """A fresh directory, on tmpfs (/dev/shm) when it is writable: for tests that commit many small bundles.

    A process kill does not depend on fsync reaching a disk there, and the tests stay fast; elsewhere `tmp_path`.
    """
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        path = Path(tempfile.mkdtemp(prefix="trainingrun-test-", dir="/dev/shm"))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)
    else:
        yield tmp_path
