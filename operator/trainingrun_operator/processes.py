"""Finding every process of a local attempt or a played pod: by a marker in the environment they inherit.

Ray starts its GCS, raylet and workers in sessions of their own, so a process group is not enough to know that an
attempt (the local backend) or a pod (the test bed's pod runner) is gone; the environment is inherited by all of
them. Linux (/proc) only; elsewhere nothing is found and callers fall back to the process group alone.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["carrying"]


def carrying(key: str, value: str) -> list[int]:
    """Pids whose environment has `key=value` (processes that exited meanwhile or cannot be read are skipped)."""
    wanted = f"{key}={value}".encode()
    found = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as env:
                    if wanted in env.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                continue
    return found
