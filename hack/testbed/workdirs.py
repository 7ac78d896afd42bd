"""A control plane's run directory: short and private under $TMPDIR, owned by the process that created it, and
swept by the next control plane once that process is gone.

Who uses it: `controlplane.ControlPlane.start` (`create`); its `stop` removes the directory unless asked to keep it.
The directory holds every component's log, etcd's data, certificates, tokens and kubeconfigs.

    $TMPDIR/trun-cp-XXXXXXXX/owner.pid    the creating process's pid; the sweep removes the directory once that
                                          pid is gone (a test process killed outright: its components died with
                                          it, through PR_SET_PDEATHSIG, but nobody removed their files)

Standard library only.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

WORKDIR_PREFIX = "trun-cp-"
OWNER_FILE = "owner.pid"
UNOWNED_GRACE_SECONDS = 60  # a directory without owner.pid may be being created right now


def create() -> Path:
    """Sweeps stale run directories, then makes a new one owned by this process."""
    sweep_stale()
    # Short and private: AF_UNIX paths (Ray, later) are limited to 107 bytes.
    workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
    (workdir / OWNER_FILE).write_text(str(os.getpid()))
    return workdir


def sweep_stale() -> None:
    """Removes run directories left by test processes that were killed outright (their components died with
    them). A directory is stale when the pid in its owner.pid is gone; one without owner.pid only after a
    minute (it may be starting right now)."""
    for workdir in Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*"):
        try:
            owner = int((workdir / OWNER_FILE).read_text())
        except (OSError, ValueError):
            try:
                if time.time() - workdir.stat().st_mtime > UNOWNED_GRACE_SECONDS:
                    shutil.rmtree(workdir, ignore_errors=True)
            except OSError:
                pass
            continue
        try:
            os.kill(owner, 0)
        except ProcessLookupError:
            shutil.rmtree(workdir, ignore_errors=True)
        except PermissionError:
            pass
