"""bench-results.json at the repository root: the figures of each benchmark under its own key.

The file is `{benchmark: {figure: value}}`. `merge` replaces one benchmark's section and keeps the others (a file
that does not parse counts as empty), written to a temporary file and renamed, so that an interrupted benchmark
leaves the previous file whole. `run_all.py` reads the file after every benchmark ran.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PATH = Path(__file__).resolve().parents[1] / "bench-results.json"


def merge(section: str, figures: Mapping[str, Any], path: Path = PATH) -> None:
    """Write `figures` as the `section` of the results file, keeping every other section."""
    current: dict[str, Any] = {}
    if path.exists():
        with contextlib.suppress(ValueError):
            current = json.loads(path.read_text())
    current[section] = dict(figures)
    tmp = path.with_suffix(f".json.tmp-{section}")
    tmp.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
