"""Budgets and backoff: each failure class is charged to its own budget; backoff grows and is capped."""

from __future__ import annotations

import pytest

from trainingrun_operator.core import model, restarts
from trainingrun_operator.core.classification import FailureClass


@pytest.mark.parametrize(
    ("n", "expected"),
    [(0, 0.0), (1, 10.0), (2, 20.0), (3, 40.0), (4, 80.0), (5, 100.0), (6, 100.0), (10_000, 100.0)],
)
def test_backoff_grows_by_the_factor_and_stops_at_the_cap(n: int, expected: float) -> None:
    backoff = model.Backoff(initial_seconds=10, max_seconds=100, factor=2)
    assert restarts.backoff_seconds(backoff, n) == expected


def test_backoff_with_factor_one_stays_at_the_initial_delay() -> None:
    backoff = model.Backoff(initial_seconds=3, max_seconds=100, factor=1)
    assert [restarts.backoff_seconds(backoff, n) for n in (1, 2, 50)] == [3.0, 3.0, 3.0]


@pytest.mark.parametrize(
    ("failure", "counter", "consecutive_after", "delayed"),
    [
        (FailureClass.PREEMPTED, "preempted", 1, False),
        (FailureClass.APPLICATION_FAILURE, "application_failure", 2, True),
        (FailureClass.INFRASTRUCTURE_FAILURE, "infrastructure_failure", 2, True),
        (FailureClass.FAILED_RESTORE, "failed_restore", 2, True),
        (FailureClass.STALLED, "stalled", 2, True),
    ],
)
def test_each_failure_class_is_charged_to_its_budget(
    failure: FailureClass, counter: str, consecutive_after: int, delayed: bool
) -> None:
    policy = model.RestartPolicy(failure_budget=5, preemption_budget=5)
    result = restarts.charge(policy, model.RestartCounts(), 1, failure)
    assert getattr(result.restarts, counter) == 1
    assert result.restarts.total == 1
    assert result.consecutive_failures == consecutive_after
    assert (result.delay_seconds > 0) is delayed
    assert result.exhausted == ""


def test_preemptions_are_unlimited_by_default() -> None:
    counts = model.RestartCounts(preempted=10_000, total=10_000)
    result = restarts.charge(model.RestartPolicy(), counts, 2, FailureClass.PREEMPTED)
    assert result.exhausted == ""
    assert result.consecutive_failures == 2


def test_the_preemption_after_the_budget_fails_the_run() -> None:
    policy = model.RestartPolicy(preemption_budget=2)
    first = restarts.charge(policy, model.RestartCounts(), 0, FailureClass.PREEMPTED)
    second = restarts.charge(policy, first.restarts, 0, FailureClass.PREEMPTED)
    third = restarts.charge(policy, second.restarts, 0, FailureClass.PREEMPTED)
    assert (first.exhausted, second.exhausted) == ("", "")
    assert "preemption budget exhausted" in third.exhausted


def test_the_third_consecutive_failure_exhausts_the_default_budget() -> None:
    policy = model.RestartPolicy()
    counts, consecutive, exhausted = model.RestartCounts(), 0, []
    for _ in range(3):
        result = restarts.charge(policy, counts, consecutive, FailureClass.APPLICATION_FAILURE)
        counts, consecutive = result.restarts, result.consecutive_failures
        exhausted.append(bool(result.exhausted))
    assert exhausted == [False, False, True]
