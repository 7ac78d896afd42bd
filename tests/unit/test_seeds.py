"""The seed of a test's random moments in its failure report (tests/support/seeds.py), on a real pytest run."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

JOURNEY = """
import random

def test_journey(chaos_seed):
    moment = random.Random(chaos_seed).uniform(0, 3)
    assert moment < 0, "the eviction came too late"

def test_calm(chaos_seed):
    assert chaos_seed >= 0

def test_without_random_moments():
    assert False
"""


@pytest.fixture
def run(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest('pytest_plugins = ["support.seeds"]\n')
    pytester.makepyfile(test_journey=JOURNEY)
    return pytester


def test_a_failed_journey_names_the_seed_that_replays_it_and_a_passing_one_says_nothing(
    run: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("E2E_CHAOS_SEED", raising=False)
    result = run.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.re_match_lines([r".*random moments.*", r"E2E_CHAOS_SEED=\d+ replays them"])
    assert result.stdout.str().count("replays them") == 1  # not for the calm one, nor the one with no seed


def test_e2e_chaos_seed_replays_the_given_seed(run: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("E2E_CHAOS_SEED", "1301")
    result = run.runpytest("-p", "no:cacheprovider", "test_journey.py::test_journey")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["E2E_CHAOS_SEED=1301 replays them"])
