"""runtime/requirements-heavy.txt and requirements.txt, the runtime image's dependency layers, say what
pyproject.toml says."""

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


def test_the_runtime_dockerfile_installs_torch_and_ray_first_then_the_rest_each_layer_from_its_file_alone() -> None:
    dockerfile = (REPO / "runtime" / "Dockerfile").read_text()
    copies = [line for line in dockerfile.splitlines() if line.startswith("COPY")]
    assert copies[:2] == ["COPY runtime/requirements-heavy.txt ./", "COPY runtime/requirements.txt ./"], (
        "the dependency layers must not depend on other files"
    )
    assert dockerfile.index("-r requirements-heavy.txt") < dockerfile.index("-r requirements.txt")


def test_the_heavy_layer_holds_torch_and_ray_and_nothing_else() -> None:
    heavy = (REPO / "runtime" / "requirements-heavy.txt").read_text().splitlines()
    assert [line.split("=")[0].split("[")[0] for line in heavy if not line.startswith("#")] == ["ray", "torch"]
