"""The time tables at the end of a test run (tests/support/timing.py): per marker and per file, largest first."""

from __future__ import annotations

import pytest

from support import timing

pytest_plugins = ["pytester"]


def test_a_tests_setup_call_and_teardown_count_together_under_its_file_and_each_of_its_markers() -> None:
    ledger = timing.Ledger()
    for nodeid, marks, phases in [
        ("tests/integration/test_a.py::test_one", ["integration", "parametrize"], [1.0, 4.0, 0.5]),
        ("tests/integration/test_a.py::test_two", ["integration", "cluster"], [2.0, 2.0, 0.0]),
        ("tests/unit/test_b.py::test_three", [], [0.0, 0.25, 0.0]),
    ]:
        ledger.mark(nodeid, marks)
        for seconds in phases:
            ledger.add(nodeid, seconds)

    files = ledger.by_file()
    assert list(files) == ["tests/integration/test_a.py", "tests/unit/test_b.py"]
    assert (files["tests/integration/test_a.py"].seconds, files["tests/integration/test_a.py"].tests) == (9.5, 2)
    markers = ledger.by_marker()
    assert list(markers) == ["integration", "cluster", timing.UNMARKED]
    assert (markers["integration"].seconds, markers["cluster"].seconds, markers[timing.UNMARKED].seconds) == (
        9.5,
        4.0,
        0.25,
    )
    assert "parametrize" not in markers


def test_every_marker_of_a_test_counts_when_its_names_come_as_a_generator_as_the_plugin_passes_them() -> None:
    ledger = timing.Ledger()
    ledger.mark("tests/e2e/test_c.py::test_four", (name for name in ["e2e", "cluster", "containers", "timeout"]))
    ledger.add("tests/e2e/test_c.py::test_four", 3.0)
    assert list(ledger.by_marker()) == ["cluster", "containers", "e2e"]


def test_a_table_past_its_limit_sums_the_rest_in_one_line() -> None:
    shares = {f"f{i}.py": timing.Share(seconds=10.0 - i, tests=1) for i in range(5)}
    lines = timing.table("per file:", shares, limit=2)
    assert lines[2].split()[-1] == "f0.py" and lines[3].split()[-1] == "f1.py"
    assert lines[4].split()[0] == "21.0" and lines[4].endswith("(3 more files)")
    assert len(lines) == 5


def test_a_run_ends_with_the_tables_of_where_its_time_went(pytester: pytest.Pytester) -> None:
    pytester.makeconftest('pytest_plugins = ["support.timing"]\n')
    pytester.makepyfile(
        test_slow="""
        import time, pytest

        @pytest.mark.integration
        def test_sleeps():
            time.sleep(0.3)

        def test_quick():
            pass
        """
    )
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\nmarkers =\n    integration: x\n")
    result = pytester.runpytest()
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "*where the time went (setup + call + teardown)*",
            "per marker*",
            "*integration",
            f"*{timing.UNMARKED}",
            "per file:",
            "*      2  test_slow.py",
        ]
    )
    integration_line = next(line for line in result.stdout.lines if line.endswith("  integration"))
    assert float(integration_line.split()[0]) >= 0.3
