"""The contract any training program follows to get what the built-in driver gets: recorded checkpoints, resume,
the preemption notice and stall detection. Standard library only (with trainingrun's storage, whose one outside
import is the `blake3` checksum wheel); torch and Ray are never imported.

    import sys
    from trainingrun_runtime import sdk

    run = sdk.attach()                       # what the operator passed this attempt; the run directory is ours now
    start = 0
    if (d := run.resume_dir()) is not None:  # the newest recorded checkpoint that verifies, or None: a fresh start
        start = load(d)                      # your files, as you wrote them
    for step in range(start + 1, steps + 1):
        loss = train_one_step()
        run.report(step, loss=loss)          # status.runtime, kubectl get, the stall watchdog, Prometheus
        if run.should_save(step):            # every spec.checkpoint.savePeriod steps, and at once on the notice
            with run.checkpoint(step) as d:  # a temporary directory; on exit: fsync, manifest, commit, report
                save(d)
        if run.notice:                       # the head pod is going: the newest checkpoint answers, exit 5
            run.stop()
    run.finish(steps)                        # the final report; exit 0

What the operator passes, what the program must do and what it gets: docs/sdk.md. Exit codes are the driver's
(`contract.Exit`): `PREEMPTED` after a notice (no failure budget spent), `BAD_CONFIG` for a spec that cannot run
(no retry), `RESTORE_FAILED` when no recorded checkpoint verifies (the step is marked bad); any other non-zero code
is a failure, which the failure budget counts.
"""

from __future__ import annotations

from trainingrun_runtime.contract import ATTACH_ENV, Exit
from trainingrun_runtime.sdk.attached import NotAttached, Run, attach

__all__ = [
    "ATTACH_ENV",
    "BAD_CONFIG",
    "FAILED",
    "OK",
    "PREEMPTED",
    "RESTORE_FAILED",
    "Exit",
    "NotAttached",
    "Run",
    "attach",
]

OK = Exit.OK
"""The run finished (call `Run.finish` first)."""
FAILED = Exit.FAILED
"""Anything else went wrong: a new attempt resumes from the newest checkpoint, within the failure budget."""
BAD_CONFIG = Exit.BAD_CONFIG
"""The spec cannot run (a missing model file, a bad field): retrying cannot help, the run fails at once."""
RESTORE_FAILED = Exit.RESTORE_FAILED
"""No recorded checkpoint verifies (`Run.resume_dir` exits with it): the steps are marked bad."""
PREEMPTED = Exit.PREEMPTED
"""Stopped on the head pod's notice after saving (`Run.stop`): not a failure, no budget spent."""
