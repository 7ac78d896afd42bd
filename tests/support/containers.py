"""Real containers for tests: podman (runc, cgroupfs) running the project's images, as `make images` built them.

    image = containers.image("operator")              # builds it if its inputs changed (a no-op when up to date)
    name = containers.run(image, "--read-only", ..., args=[...], detach=True)
    containers.exec_(name, "id", "-u").stdout
    containers.remove(name)

podman runs as the test bed runs it (hack/testbed/containerruntime.py: its containers.conf under the cache). A
missing podman or a failing build fails the test with the command to run; nothing here skips.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Sequence
from pathlib import Path

import containerruntime

__all__ = ["exec_", "image", "logs", "podman", "remove", "run", "unique_name"]

REPO = Path(__file__).resolve().parents[2]


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """One podman command, with the test bed's runtime settings; a failure (when `check`) fails the test."""
    try:
        return containerruntime.podman(*args, check=check, timeout=timeout)
    except containerruntime.PodmanError as err:
        raise AssertionError(str(err)) from None


def image(name: str) -> str:
    """`localhost/trainingrun-<name>:<IMAGE_TAG, default dev>`, rebuilt first if its inputs changed since it was
    built (hack/images/build.sh reads IMAGE_TAG too: a checkout beside another can build and test its own)."""
    build = subprocess.run(
        ["bash", str(REPO / "hack" / "images" / "build.sh"), name], capture_output=True, text=True, timeout=3600
    )
    assert build.returncode == 0, f"make images failed:\n{build.stdout[-2000:]}\n{build.stderr[-3000:]}"
    return containerruntime.image_ref(name)


def run(
    image_ref: str, *options: str, args: Sequence[str] = (), detach: bool = False, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """`podman run` of `image_ref` (`--rm` unless detached; name it with `--name` among `options`)."""
    mode = ["-d"] if detach else ["--rm"]
    return podman("run", *mode, *options, image_ref, *args, check=False, timeout=timeout)


def exec_(name: str, *command: str) -> subprocess.CompletedProcess[str]:
    return podman("exec", name, *command, check=False)


def logs(name: str) -> str:
    result = podman("logs", name, check=False)
    return result.stdout + result.stderr


def remove(name: str) -> None:
    podman("rm", "--force", "--time", "0", name, check=False)


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
