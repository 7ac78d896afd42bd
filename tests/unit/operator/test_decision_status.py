"""The decision core's status as kubectl shows it: conditions that keep their transition time, times to the
second (the next attempt's to the millisecond), the progress columns written only when they change, and the
attempt table.

Journeys against an in-memory status (`support.decisions.Store`).
"""

from __future__ import annotations

import datetime

from support.decisions import T0, Store, failed, gone, preempted, running, start_and_run


def test_conditions_carry_the_generation_and_keep_their_transition_time() -> None:
    store = Store()
    start_and_run(store)
    first = {c["type"]: c for c in store.status["conditions"]}["Running"]
    store.now += datetime.timedelta(minutes=1)
    store.generation = 2
    store.decide(running(1))
    again = {c["type"]: c for c in store.status["conditions"]}["Running"]
    assert again["lastTransitionTime"] == first["lastTransitionTime"]
    assert again["observedGeneration"] == 2 and store.status["observedGeneration"] == 2


def test_status_times_are_written_to_the_second_and_the_next_attempts_time_to_the_millisecond() -> None:
    store = Store()
    store.now = T0 + datetime.timedelta(seconds=1, microseconds=987654)
    start_and_run(store)
    store.decide(failed(1))
    assert store.status["attempt"]["start"] == "2025-01-01T00:00:01Z", "truncated, as the API server writes times"
    assert {c["lastTransitionTime"] for c in store.status["conditions"]} == {"2025-01-01T00:00:01Z"}
    assert store.status["nextAttemptTime"] == "2025-01-01T00:00:11.987Z"  # tiny's backoff here: 10 s


def test_a_pass_that_learns_a_step_writes_only_progress_and_goodput_and_one_that_learns_nothing_writes_nothing() -> (
    None
):
    store = Store()
    start_and_run(store)
    store.report(1, 10)
    store.decide(running(1))
    assert (store.status["progress"], store.status["rate"]["step"]) == ("10/120", 10)
    store.status["runtime"].update(step=25, reward=0.4567, updated="2025-01-01T00:00:30Z")
    store.now += datetime.timedelta(seconds=31)
    patch = dict(store.decide(running(1)).patch)
    assert patch.pop("goodput")["asOf"] == "2025-01-01T00:00:30Z"  # as of the new report (core/goodput.py)
    assert patch == {
        "progress": "25/120",
        "reward": 0.457,
        "eta": "3m",
        "rate": {"step": 25, "time": "2025-01-01T00:00:30Z", "stepsPerSecond": 0.5},
    }
    store.now += datetime.timedelta(seconds=40)
    assert store.decide(running(1)).patch == {}


def test_the_attempt_table_follows_the_attempts_through_a_preemption() -> None:
    store = Store()
    start_and_run(store)
    assert [line.split()[0] for line in store.status["attemptTable"]] == ["ATTEMPT", "1"]
    store.report(1, 10)
    store.decide(running(1))
    store.now += datetime.timedelta(minutes=2)
    store.decide(preempted(1))
    assert store.status["attemptTable"][1].split()[2:5] == ["2m00s", "fresh", "Preempted"]
    store.decide(gone(1))
    assert [line.split()[:2] for line in store.status["attemptTable"][1:]] == [
        ["1", "2025-01-01T00:00:00Z"],
        ["2", "2025-01-01T00:02:00Z"],
    ]
