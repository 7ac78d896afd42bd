"""Real containers for tests: podman (runc, cgroupfs) running the project's images, as `make images` built them.

    image = containers.image("operator")              # builds it if its inputs changed (a no-op when up to date)
    name = containers.run(image, "--read-only", ..., args=[...], detach=True)
    containers.exec_(name, "id", "-u").stdout
    containers.remove(name)

podman is configured as hack/images/build.sh configures it (its containers.conf under the cache). A missing
podman or a failing build fails the test with the command to run; nothing here skips.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Sequence
from pathlib import Path

__all__ = ["exec_", "image", "logs", "podman", "remove", "run", "unique_name"]

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("TESTBED_CACHE", Path.home() / ".cache" / "trainingrun")) / "images"


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """One podman command, with the test bed's runtime settings."""
    if shutil.which("podman") is None:
        raise AssertionError("podman is not installed: run `make images` (it installs podman, runc and mmdebstrap)")
    env = {**os.environ, "CONTAINERS_CONF": str(CACHE / "containers.conf")}
    result = subprocess.run(
        ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs", *args],
        capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args[:3])} ... failed ({result.returncode}): {result.stderr[-3000:]}")
    return result


def image(name: str) -> str:
    """`localhost/trainingrun-<name>:<IMAGE_TAG, default dev>`, rebuilt first if its inputs changed since it was
    built (hack/images/build.sh reads IMAGE_TAG too: a checkout beside another can build and test its own)."""
    build = subprocess.run(
        ["bash", str(REPO / "hack" / "images" / "build.sh"), name], capture_output=True, text=True, timeout=3600
    )
    assert build.returncode == 0, f"make images failed:\n{build.stdout[-2000:]}\n{build.stderr[-3000:]}"
    return f"localhost/trainingrun-{name}:{os.environ.get('IMAGE_TAG') or 'dev'}"


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
