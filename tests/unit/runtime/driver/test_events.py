"""The event log: one JSON line per event, in order, by default beside the run's checkpoints."""

from __future__ import annotations

from pathlib import Path

from trainingrun_runtime.driver import events


def test_events_are_read_back_in_the_order_they_were_emitted_with_their_fields(tmp_path: Path) -> None:
    log = events.EventLog(tmp_path / "e.jsonl")
    log.emit("driver_started", attempt=2)
    log.emit("step_done", step=1, reward=0.5)
    read = events.read(tmp_path / "e.jsonl")
    assert [e["event"] for e in read] == ["driver_started", "step_done"]
    assert read[1]["step"] == 1 and read[1]["reward"] == 0.5 and read[0]["t"] <= read[1]["t"]


def test_a_driver_logs_beside_the_checkpoints_unless_told_otherwise(tmp_path: Path) -> None:
    path = events.default_path(tmp_path, "run", 3)
    assert path == tmp_path / "run" / "attempts" / "3" / "events.jsonl" and path.parent.is_dir()
    assert events.read(path) == []
