"""The seed of a test's random moments, printed in the test's failure report so that a failed run can be replayed.

A journey that evicts pods or kills drivers at random moments draws them from `random.Random(seed)`. The seed is
`E2E_CHAOS_SEED` when it is set (to replay a failure), else the test's own default, else a new one from the clock.
`chosen` (or the `chaos_seed` fixture) records it on the test, and the report of a test that fails gets a section
of its own, "random moments: E2E_CHAOS_SEED=N replays them", beside the error rather than in the captured output.

A pytest plugin, loaded by tests/conftest.py (`pytest_plugins`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

ENV = "E2E_CHAOS_SEED"
KEY = "chaos_seed"  # the name in the test's user_properties (and so in a JUnit XML report too)


def chosen(item: pytest.Item, default: int | None = None) -> int:
    """The seed of `item`'s random moments (see the module's docstring), recorded on it for its failure report."""
    text = os.environ.get(ENV)
    seed = int(text) if text else default if default is not None else time.time_ns() % 2**31
    item.user_properties.append((KEY, seed))
    return seed


def section(item: pytest.Item) -> tuple[str, str] | None:
    """The report section that names `item`'s seed, None when it drew no random moments."""
    drawn = [value for key, value in item.user_properties if key == KEY]
    if not drawn:
        return None
    return "random moments", f"{ENV}={drawn[-1]} replays them"


@pytest.fixture
def chaos_seed(request: pytest.FixtureRequest) -> int:
    """The seed of this test's random moments, printed in its failure report."""
    return chosen(request.node)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test that drew random moments says in its report which seed replays them."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed and (named := section(item)) is not None:
        report.sections.append(named)
