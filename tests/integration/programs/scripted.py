"""A program that follows the SDK's contract, then misbehaves as `SCRIPT` says, attempt by attempt.

    SCRIPT="1:hang,2:crash"   attempt 1 hangs 5 steps after its start (a deadlock: the watchdog's case); attempt 2
                              crashes (exit FAILED) on its first step, before it saves anything (a crash loop);
                              attempt 3 and later run to the end; `preempt` exits PREEMPTED 5 steps after the
                              start, as a program would after its own preemption signal
    STEP_S=0.05               how long a step's work takes

Its state is the step it reached, so a resume shows in the files: step_N/step holds N.
"""

import os
import sys
import time

from trainingrun_runtime import sdk


def main() -> int:
    run = sdk.attach()
    plan = dict(item.split(":") for item in os.environ.get("SCRIPT", "").split(",") if item)
    action = plan.get(str(run.attempt), "")
    step_s = float(os.environ.get("STEP_S", "0.05"))
    start = 0
    if (resume := run.resume_dir()) is not None:
        start = int((resume / "step").read_text())
    steps = int(run.trainer.get("steps", 20))
    for step in range(start + 1, steps + 1):
        time.sleep(step_s)  # the step's work
        run.report(step, loss=1.0 / step)
        if run.should_save(step) or step == steps:
            with run.checkpoint(step, final=step == steps) as directory:
                (directory / "step").write_text(str(step))
        if step == start + 5 and action == "hang":
            threading_deadlock()
        if step == start + 1 and action == "crash":
            print(f"crashing at step {step} as scripted", file=sys.stderr)
            return sdk.FAILED
        if step == start + 5 and action == "preempt":
            return sdk.PREEMPTED
        if run.notice:
            run.stop()
    run.finish(steps)
    return sdk.OK


def threading_deadlock() -> None:
    """What a hung collective looks like from outside: the process lives and reports nothing more."""
    import threading

    lock = threading.Lock()
    lock.acquire()
    lock.acquire()


if __name__ == "__main__":
    raise SystemExit(main())
