"""The preemption notice's file protocol and the rule for whether a save fits before the deadline."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from trainingrun_runtime.sdk import notice


def test_a_request_is_pending_for_its_attempt_only(tmp_path: Path) -> None:
    notice.request(tmp_path, "run", 2, deadline=123.0, reason="evicted")
    got = notice.pending(tmp_path, "run", 2)
    assert got is not None
    assert (got.deadline, got.reason) == (123.0, "evicted")
    assert notice.pending(tmp_path, "run", 3) is None


def test_a_torn_request_counts_as_none(tmp_path: Path) -> None:
    path = tmp_path / "run" / "attempts" / "1" / notice.REQUEST_FILE
    path.parent.mkdir(parents=True)
    path.write_text('{"deadline": ')
    assert notice.pending(tmp_path, "run", 1) is None


def test_the_hook_gets_the_answer_the_driver_writes(tmp_path: Path) -> None:
    notice.listen(tmp_path, "run", 1)

    def answer_soon() -> None:
        time.sleep(0.3)
        notice.answer(tmp_path, "run", 1, notice.Answer(step=8, why="saved"))

    threading.Thread(target=answer_soon).start()
    got = notice.wait_for_answer(tmp_path, "run", 1, deadline=time.time() + 10)
    assert got == notice.Answer(step=8, why="saved")


def test_the_hook_gives_up_at_the_deadline(tmp_path: Path) -> None:
    notice.listen(tmp_path, "run", 1)
    assert notice.wait_for_answer(tmp_path, "run", 1, deadline=time.time() + 0.3) is None


def test_the_hook_exits_zero_even_with_no_answer(tmp_path: Path) -> None:
    notice.listen(tmp_path, "r", 1)
    code = notice.main(["--root", str(tmp_path), "--run", "r", "--attempt", "1", "--grace-seconds", "2.2"])
    assert code == 0
    assert notice.pending(tmp_path, "r", 1) is not None


def test_a_save_that_fits_with_room_to_spare_is_started() -> None:
    assert notice.time_for_a_save(now=0.0, deadline=20.0, save_s=3.0, step_s=2.0)


def test_a_save_longer_than_the_time_left_is_skipped() -> None:
    assert not notice.time_for_a_save(now=0.0, deadline=5.0, save_s=4.0)


def test_a_passed_deadline_allows_no_save() -> None:
    assert not notice.time_for_a_save(now=10.0, deadline=9.0, save_s=None)


def test_an_unknown_save_time_is_tried_when_there_are_seconds_left() -> None:
    assert notice.time_for_a_save(now=0.0, deadline=8.0, save_s=None)


def test_the_hook_returns_at_once_when_no_driver_listens(tmp_path: Path) -> None:
    started = time.monotonic()
    assert notice.main(["--root", str(tmp_path), "--run", "r", "--attempt", "1", "--grace-seconds", "30"]) == 0
    assert time.monotonic() - started < 1
    assert notice.pending(tmp_path, "r", 1) is None  # nobody to ask


def test_the_hook_stops_waiting_when_the_listener_dies(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    listener = tmp_path / "r" / "attempts" / "1" / notice.LISTENER_FILE
    listener.parent.mkdir(parents=True)
    listener.write_text(json.dumps({"pid": child.pid}))
    assert notice.listening(tmp_path, "r", 1)
    threading.Timer(0.3, child.kill).start()
    started = time.monotonic()
    assert notice.wait_for_answer(tmp_path, "r", 1, deadline=time.time() + 30) is None
    assert time.monotonic() - started < 5
    child.wait()


def test_a_withdrawn_listener_no_longer_listens(tmp_path: Path) -> None:
    notice.listen(tmp_path, "r", 1)
    assert notice.listening(tmp_path, "r", 1)
    notice.stop_listening(tmp_path, "r", 1)
    assert not notice.listening(tmp_path, "r", 1)
