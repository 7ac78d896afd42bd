"""Writes runtime/requirements-heavy.txt and runtime/requirements.txt: the runtime image's two dependency layers.

    python hack/images/requirements.py [--check]

requirements.txt is the core dependencies and the `runtime` extra of pyproject.toml, in order; requirements-heavy.txt
is the part of it that makes the image 6 GB (torch and Ray). runtime/Dockerfile installs the heavy file in one layer
and then the whole list in the next, each layer copying only its file: a new or changed light dependency rebuilds
the second layer (seconds), not torch's (minutes), and no layer is rebuilt on an edit of pyproject.toml that leaves
the dependencies alone (pytest options, lint rules). tests/unit/test_image_requirements.py fails when a file is
out of date.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "runtime" / "requirements.txt"
HEAVY_OUT = REPO / "runtime" / "requirements-heavy.txt"
HEAVY = ("torch", "ray")
"""The distributions of the first layer (with what they pull in: the bulk of the image)."""
HEADER = "# Generated from pyproject.toml by hack/images/requirements.py: {what}.\n"


def _name(requirement: str) -> str:
    return re.split(r"[\[=<>~! ;]", requirement, maxsplit=1)[0].lower()


def render() -> dict[Path, str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    every = [*project["dependencies"], *project["optional-dependencies"]["runtime"]]
    heavy = [r for r in every if _name(r) in HEAVY]
    return {
        HEAVY_OUT: HEADER.format(what="torch and Ray, the image's first dependency layer")
        + "".join(f"{r}\n" for r in heavy),
        OUT: HEADER.format(what="the core dependencies and the runtime extra") + "".join(f"{r}\n" for r in every),
    }


def main() -> int:
    wanted = render()
    if "--check" in sys.argv[1:]:
        stale = [path for path, text in wanted.items() if not path.exists() or path.read_text() != text]
        for path in stale:
            print(f"{path} is out of date: run python hack/images/requirements.py", file=sys.stderr)
        return 1 if stale else 0
    for path, text in wanted.items():
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
