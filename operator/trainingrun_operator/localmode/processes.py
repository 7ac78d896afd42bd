"""Finding every process of a local attempt or a played pod: by a marker in the environment they inherit.

Ray starts its GCS, raylet and workers in sessions of their own, so a process group is not enough to know that an
attempt (the local backend) or a pod (the test bed's pod runner) is gone; the environment is inherited by all of
them. Linux (/proc) only; elsewhere nothing is found and callers fall back to the process group alone.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["carrying", "exists", "marked"]


def marked(key: str) -> dict[int, str]:
    """pid -> the value of `key` in its environment, for every process that has it (processes that exited
    meanwhile, zombies and those that cannot be read are skipped)."""
    wanted = f"{key}=".encode()
    found = {}
    with contextlib.suppress(FileNotFoundError):
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as env:
                    variables = env.read().split(b"\0")
            except OSError:
                continue
            value = next((v[len(wanted) :] for v in variables if v.startswith(wanted)), None)
            if value is not None:
                found[int(entry)] = value.decode(errors="replace")
    return found


def carrying(key: str, value: str) -> list[int]:
    """Pids whose environment has `key=value`."""
    return sorted(pid for pid, found in marked(key).items() if found == value)


def exists(pid: int) -> bool:
    """Whether a process with this pid exists (a zombie counts: its parent has not reaped it yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
