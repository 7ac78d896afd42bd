"""Writes runtime/requirements.txt: what the runtime image installs in its dependency layer.

    python hack/images/requirements.py [--check]

The list is the core dependencies and the `runtime` extra of pyproject.toml, in order. runtime/Dockerfile copies
only this file before installing, so its 6 GB dependency layer is rebuilt when the dependencies change, not on
every edit of pyproject.toml (pytest options, lint rules). tests/unit/test_image_requirements.py fails when the
file is out of date.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "runtime" / "requirements.txt"
HEADER = (
    "# Generated from pyproject.toml by hack/images/requirements.py: the core dependencies and the runtime extra.\n"
)


def render() -> str:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return HEADER + "".join(f"{r}\n" for r in [*project["dependencies"], *project["optional-dependencies"]["runtime"]])


def main() -> int:
    if "--check" in sys.argv[1:]:
        if not OUT.exists() or OUT.read_text() != render():
            print(f"{OUT} is out of date: run python hack/images/requirements.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
