"""Where a test run's time goes: the seconds of each file and of each marker, printed at the end of the run.

pytest's `--durations` names the slowest phases one by one; what decides how long `make test` takes is the sum
per file (a module's shared fixtures, its journeys) and per marker (the two groups `make test` runs). This plugin
adds both tables to the terminal summary, setup, call and teardown counted together, so that every run's log says
where its time went and a change can be judged by the table before and after it.

Loaded by tests/conftest.py (`pytest_plugins`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import pytest

# The markers `make test` groups by (pyproject.toml); a test with none of them is a unit test.
MARKERS = ("integration", "e2e", "cluster", "containers")
UNMARKED = "(none: unit)"
SHOWN_FILES = 25


@dataclass
class Share:
    seconds: float = 0.0
    tests: int = 0


@dataclass
class Ledger:
    """The seconds each test took, with the markers it carries."""

    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    markers: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def add(self, nodeid: str, seconds: float) -> None:
        self.seconds[nodeid] += seconds

    def mark(self, nodeid: str, names: Iterable[str]) -> None:
        present = set(names)  # once: `names` may be a generator (the plugin passes one)
        self.markers[nodeid] = tuple(name for name in MARKERS if name in present)

    def by_file(self) -> dict[str, Share]:
        return _shares((nodeid.split("::", 1)[0], seconds) for nodeid, seconds in self.seconds.items())

    def by_marker(self) -> dict[str, Share]:
        return _shares(
            (name, seconds)
            for nodeid, seconds in self.seconds.items()
            for name in (self.markers.get(nodeid) or (UNMARKED,))
        )


def _shares(pairs: Iterable[tuple[str, float]]) -> dict[str, Share]:
    shares: dict[str, Share] = defaultdict(Share)
    for key, seconds in pairs:
        shares[key].seconds += seconds
        shares[key].tests += 1
    return dict(sorted(shares.items(), key=lambda kv: (-kv[1].seconds, kv[0])))


def table(title: str, shares: Mapping[str, Share], limit: int | None = None) -> list[str]:
    """The lines of one table: seconds, share of the total, test count and the key, largest first."""
    total = sum(share.seconds for share in shares.values()) or 1.0
    rows = list(shares.items())
    lines = [title, f"{'seconds':>9} {'share':>6} {'tests':>6}  what"]
    for key, share in rows[:limit]:
        lines.append(f"{share.seconds:9.1f} {share.seconds / total:6.1%} {share.tests:6d}  {key}")
    if limit is not None and len(rows) > limit:
        rest = rows[limit:]
        seconds = sum(share.seconds for _, share in rest)
        tests = sum(share.tests for _, share in rest)
        lines.append(f"{seconds:9.1f} {seconds / total:6.1%} {tests:6d}  ({len(rest)} more files)")
    return lines


class Timing:
    """The plugin: fills a ledger as reports come in and prints it at the end."""

    def __init__(self) -> None:
        self.ledger = Ledger()

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        self.ledger.mark(item.nodeid, (mark.name for mark in item.iter_markers()))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.ledger.add(report.nodeid, report.duration)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.ledger.seconds:
            return
        terminalreporter.section("where the time went (setup + call + teardown)")
        for line in table("per marker (a test counts under each marker it has):", self.ledger.by_marker()):
            terminalreporter.write_line(line)
        terminalreporter.write_line("")
        for line in table("per file:", self.ledger.by_file(), limit=SHOWN_FILES):
            terminalreporter.write_line(line)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(Timing(), "trainingrun-timing")
