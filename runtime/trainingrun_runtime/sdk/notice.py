"""The preemption notice: the head pod is about to go; the driver cuts a checkpoint it can finish in time, and stops.

    kubelet deletes the head pod (eviction, preemption, node drain, spot reclaim)
      └─ runs the Ray container's preStop hook:  python -m trainingrun_runtime.sdk.notice --root R --run X
                                                   --attempt N --grace-seconds G
           writes R/X/attempts/N/notice.json {"deadline": t, "reason": ...}   (the request)
           waits for R/X/attempts/N/notice-answer.json, or until the deadline (then gives up: SIGTERM follows)
      controller (a `watch` task; a stat every POLL_S):
           at the next step boundary: a save it can finish before the deadline (its recent save times say how
           long one takes) -> checkpoint, committed and reported with reason PreemptionNotice; then it trains no
           more; a save already under way at that step counts (one checkpoint, not two)
           writes the answer {"step": S | null, "why": ...}; the driver then exits (`contract.Exit.PREEMPTED`)
      kubelet: SIGTERM, then SIGKILL at the end of the grace period

Files, not Ray calls: the hook is a short standard-library process that starts in milliseconds and needs no Ray
connection, and the run directory is on the checkpoint volume that the head mounts. The hook always exits 0:
Kubernetes goes on with the deletion either way. It waits only while a controller listens (`listen` wrote its pid
in notice-listener.json and that process lives): a head deleted before the driver started, or after it ended (the
cluster's own teardown), goes at once instead of holding its pod for the grace period. Standard library only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Final

from trainingrun_runtime import timestamps
from trainingrun_runtime.storage import files

__all__ = [
    "ANSWER_FILE",
    "LISTENER_FILE",
    "MARGIN_S",
    "POLL_S",
    "REQUEST_FILE",
    "Answer",
    "Notice",
    "answer",
    "listen",
    "listening",
    "main",
    "pending",
    "request",
    "stop_listening",
    "time_for_a_save",
    "wait_for_answer",
]

REQUEST_FILE: Final = "notice.json"
ANSWER_FILE: Final = "notice-answer.json"
LISTENER_FILE: Final = "notice-listener.json"
UNKNOWN_SAVE_S: Final = 3.0
"""A save's duration before this attempt has timed one (the example's save takes about a second here)."""
POLL_S: Final = 0.2
"""How often the controller looks for a request, and the hook for the answer."""
MARGIN_S: Final = 2.0
"""Of the grace period, what the hook leaves for SIGTERM and the processes' exit: the deadline is grace - margin."""


@dataclasses.dataclass(frozen=True)
class Notice:
    """A request to save and stop: by when (wall-clock seconds) and why."""

    deadline: float
    reason: str
    requested: float


@dataclasses.dataclass(frozen=True)
class Answer:
    """What the driver did about a notice: the step it saved (None: no save was possible in time) and why."""

    step: int | None
    why: str


def _dir(root: str | os.PathLike[str], run: str, attempt: int) -> Path:
    return Path(root) / run / "attempts" / str(attempt)


def _write(path: Path, value: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    files.replace_synced(path, json.dumps(value).encode())


def request(root: str | os.PathLike[str], run: str, attempt: int, deadline: float, reason: str) -> None:
    """Ask the driver of `attempt` to save and stop before `deadline` (wall-clock seconds)."""
    _write(_dir(root, run, attempt) / REQUEST_FILE, {"deadline": deadline, "reason": reason, "requested": time.time()})


def pending(root: str | os.PathLike[str], run: str, attempt: int) -> Notice | None:
    """The request for `attempt`, if one was made (a torn or foreign file counts as none)."""
    try:
        raw = json.loads((_dir(root, run, attempt) / REQUEST_FILE).read_text())
        return Notice(float(raw["deadline"]), str(raw.get("reason", "")), float(raw.get("requested", 0.0)))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def answer(root: str | os.PathLike[str], run: str, attempt: int, result: Answer) -> None:
    """Tell the waiting hook what was done."""
    _write(_dir(root, run, attempt) / ANSWER_FILE, {"step": result.step, "why": result.why, "at": timestamps.now()})


def listen(root: str | os.PathLike[str], run: str, attempt: int) -> None:
    """Say that this process answers notices for `attempt` (the controller, once its pumps start)."""
    _write(_dir(root, run, attempt) / LISTENER_FILE, {"pid": os.getpid(), "at": timestamps.now()})


def stop_listening(root: str | os.PathLike[str], run: str, attempt: int) -> None:
    """Withdraw `listen` (the run ended or stopped): a hook from now on returns at once."""
    try:
        (_dir(root, run, attempt) / LISTENER_FILE).unlink()
    except OSError:
        pass


def listening(root: str | os.PathLike[str], run: str, attempt: int) -> bool:
    """Whether a live process listens for `attempt`'s notice (same machine and pid namespace: the head pod)."""
    try:
        pid = int(json.loads((_dir(root, run, attempt) / LISTENER_FILE).read_text())["pid"])
        os.kill(pid, 0)
    except (OSError, ValueError, KeyError, TypeError):
        return False
    try:  # a zombie (dead, not yet reaped) answers kill(0) too
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc: the signal said enough


def wait_for_answer(root: str | os.PathLike[str], run: str, attempt: int, deadline: float) -> Answer | None:
    """The driver's answer, once it is there; None at the deadline or once no controller listens."""
    path = _dir(root, run, attempt) / ANSWER_FILE
    while True:
        try:
            raw = json.loads(path.read_text())
            return Answer(raw.get("step"), str(raw.get("why", "")))
        except (OSError, ValueError, TypeError):
            pass
        if time.time() >= deadline or not listening(root, run, attempt):
            return None
        time.sleep(POLL_S)


def time_for_a_save(now: float, deadline: float, save_s: float | None, step_s: float | None = None) -> bool:
    """Whether a save (taking about `save_s`, after a step in flight taking about `step_s`) ends before `deadline`,
    with half again as much to spare. A save not yet timed in this attempt is taken as UNKNOWN_SAVE_S."""
    expected = (save_s if save_s is not None else UNKNOWN_SAVE_S) + (step_s or 0.0)
    return expected * 1.5 < deadline - now


def main(argv: list[str] | None = None) -> int:
    """The preStop hook: request a save, wait for the answer or the deadline; always exit 0."""
    p = argparse.ArgumentParser(prog="python -m trainingrun_runtime.sdk.notice", description=__doc__)
    p.add_argument("--root", required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--attempt", type=int, required=True)
    p.add_argument("--grace-seconds", type=float, required=True, help="the pod's terminationGracePeriodSeconds")
    p.add_argument("--reason", default="the pod is being deleted (preStop)")
    args = p.parse_args(argv)
    deadline = time.time() + max(0.0, args.grace_seconds - MARGIN_S)
    if not listening(args.root, args.run, args.attempt):
        print(
            "notice: no driver listens for this attempt (not started yet, or ended); nothing to save", file=sys.stderr
        )
        return 0
    try:
        request(args.root, args.run, args.attempt, deadline, args.reason)
        result = wait_for_answer(args.root, args.run, args.attempt, deadline)
    except OSError as e:  # the volume is gone: nothing to save to
        print(f"notice: {e}", file=sys.stderr)
        return 0
    print(f"notice: {result if result is not None else 'no answer before the deadline'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
