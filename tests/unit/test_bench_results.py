"""bench/results.py: each benchmark writes its own section of bench-results.json and leaves the others."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

BENCH_RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_results", BENCH_RESULTS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_benchmark_replaces_its_own_section_and_keeps_the_others(tmp_path: Path) -> None:
    path = tmp_path / "bench-results.json"
    results = load()
    results.merge("grpo", {"a": 1}, path)
    results.merge("imports", {"b": 2}, path)
    results.merge("grpo", {"c": 3}, path)
    assert json.loads(path.read_text()) == {"grpo": {"c": 3}, "imports": {"b": 2}}
    assert [p.name for p in tmp_path.iterdir()] == ["bench-results.json"]


def test_a_results_file_that_does_not_parse_is_replaced_by_the_new_section(tmp_path: Path) -> None:
    path = tmp_path / "bench-results.json"
    path.write_text('{"grpo": {"a": 1')  # a benchmark killed mid-write, before results.py wrote through a rename
    load().merge("imports", {"b": 2}, path)
    assert json.loads(path.read_text()) == {"imports": {"b": 2}}
