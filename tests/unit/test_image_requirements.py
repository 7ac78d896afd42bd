"""runtime/requirements.txt, the runtime image's dependency layer, says what pyproject.toml says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_runtime_images_requirements_match_pyproject() -> None:
    check = subprocess.run(
        [sys.executable, str(REPO / "hack" / "images" / "requirements.py"), "--check"], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr


def test_the_runtime_dockerfile_installs_the_dependencies_from_that_file_alone() -> None:
    dockerfile = (REPO / "runtime" / "Dockerfile").read_text()
    copies = [line for line in dockerfile.splitlines() if line.startswith("COPY")]
    assert copies[0] == "COPY runtime/requirements.txt ./", "the dependency layer must not depend on other files"
    assert "-r requirements.txt" in dockerfile
