"""A pod's volumes on a shared filesystem: each PVC is bind-mounted at its mountPath inside a private mount
namespace of the pod's `ray start` (`unshare -m`; needs root), and the host directories that had to be created so
that the mountPath exists are counted by user and removed when the last pod that needed them ends.

Who uses it: `podrunner.PodRunner` (starting and ending pods). Standard library only.
"""

from __future__ import annotations

import os
import shlex
import threading
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Bind:
    """A directory of the host (the PV's hostPath, or a subPath in it) seen at `target` inside the pod."""

    source: Path
    target: Path
    read_only: bool


def in_private_mount_namespace(command: list[str], binds: list[Bind]) -> list[str]:
    """`command`, run in a private mount namespace after each bind mount (read-only ones remounted so)."""
    script = []
    for bind in binds:
        script.append(f"mount --bind {shlex.quote(str(bind.source))} {shlex.quote(str(bind.target))}")
        if bind.read_only:
            script.append(f"mount -o remount,bind,ro {shlex.quote(str(bind.target))}")
    script.append("exec " + shlex.join(command))
    return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-ec", "; ".join(script)]


@dataclass(eq=False)
class Mountpoints:
    """The host directories created for mountPaths, each with the number of pods that use it."""

    _users: dict[Path, int] = field(default_factory=dict)  # topmost directory created -> pods using it
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def ensure(self, target: Path) -> Path | None:
        """Makes `target` exist. Returns the directory to `release` when the pod ends: the topmost one created
        now, or an earlier one of ours that holds `target`; None when `target` was the host's own."""
        with self._lock:
            missing = target
            while not missing.parent.exists():
                missing = missing.parent
            if not target.exists():
                target.mkdir(parents=True)
                self._users[missing] = self._users.get(missing, 0) + 1
                return missing
            root = next((p for p in self._users if p == target or p in target.parents), None)
            if root is not None:
                self._users[root] += 1
            return root

    def release(self, root: Path) -> None:
        """One pod fewer uses `root`; the last one removes it (and only the empty directories below it). A root that
        `remove_all` removed already (the runner stopped while a pod's kill was still finishing) is left alone."""
        with self._lock:
            if root not in self._users:
                return
            self._users[root] -= 1
            if self._users[root] <= 0:
                del self._users[root]
                remove_empty_dirs(root)

    def remove_all(self) -> None:
        """Removes every directory created, deepest first, whoever still counts as using it."""
        with self._lock:
            for root in sorted(self._users, key=lambda p: len(p.parts), reverse=True):
                remove_empty_dirs(root)
            self._users.clear()


def remove_empty_dirs(root: Path) -> None:
    """Removes `root` and the empty directories below it (the mountpoints a pod needed); keeps anything else."""
    if not root.is_dir():
        return
    for directory, _subdirs, _files in sorted(os.walk(root), key=lambda w: len(w[0]), reverse=True):
        try:
            os.rmdir(directory)
        except OSError:
            pass
