"""Buffers kept for the life of the process and lent out again: memory that is already mapped.

New memory is faulted in page by page when first touched (and on a VM that hands free pages back to its
host, each page comes back from the host again); a checkpoint hashes and writes through the same few buffers
every time. Used by `files.hash_file` (read buffers) and `dataplane.staging` (staging buffers).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["BufferPool"]

B = TypeVar("B")


class BufferPool(Generic[B]):
    """Buffers made by `make` on demand and kept once given back; thread-safe, unbounded (as many as were out)."""

    def __init__(self, make: Callable[[], B]) -> None:
        self._make = make
        self._free: list[B] = []
        self._lock = threading.Lock()

    def take(self) -> B:
        with self._lock:
            if self._free:
                return self._free.pop()
        return self._make()

    def give(self, buf: B) -> None:
        with self._lock:
            self._free.append(buf)

    @contextlib.contextmanager
    def lend(self) -> Iterator[B]:
        """A buffer for the `with` block, given back at its end."""
        buf = self.take()
        try:
            yield buf
        finally:
            self.give(buf)
