"""The test bed's container runtime: podman with runc and cgroupfs, configured as hack/images/build.sh configures it
(its containers.conf without default ulimits, under the cache; testbed-facts.md), and the project's images by name.

Who uses it: `containerpods` (the pod runner's containers), `chaos` (a hung container) and the tests
(tests/support/containers.py, which also builds the images).

    podman("ps", "-a")                 one podman command; PodmanError when it fails (unless check=False)
    command("run", ...)                the argv of one, for a `podman run` that stays attached (a Popen)
    image_ref("operator")              localhost/trainingrun-operator:<IMAGE_TAG, default dev>

Standard library only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

CACHE = Path(os.environ.get("TESTBED_CACHE", Path.home() / ".cache" / "trainingrun")) / "images"
CONTAINERS_CONF = CACHE / "containers.conf"


class PodmanError(RuntimeError):
    """podman is missing or a podman command failed; the message has the command and its stderr (`make images`
    installs podman and writes its configuration)."""


def environment() -> dict[str, str]:
    """The environment a podman command runs with: this process's, plus the bed's containers.conf."""
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def command(*args: str) -> list[str]:
    """The argv of `podman <args>` with the bed's runtime settings (run it with `environment()`)."""
    if shutil.which("podman") is None or not CONTAINERS_CONF.is_file():
        raise PodmanError(
            f"podman or {CONTAINERS_CONF} is missing: run `make images` (it installs podman, runc and mmdebstrap "
            "and writes the configuration)"
        )
    return ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs", *args]


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Runs one podman command to its end; PodmanError when it exits non-zero and `check`."""
    result = subprocess.run(
        command(*args), capture_output=True, text=True, timeout=timeout, env=environment(), stdin=subprocess.DEVNULL
    )
    if check and result.returncode != 0:
        raise PodmanError(f"podman {' '.join(args[:3])} ... failed ({result.returncode}): {result.stderr[-3000:]}")
    return result


def image_tag() -> str:
    """The tag the project's images are built and run under: IMAGE_TAG, default `dev` (as hack/images/build.sh)."""
    return os.environ.get("IMAGE_TAG") or "dev"


def image_ref(name: str) -> str:
    """`localhost/trainingrun-<name>:<tag>`: a local image (a bare name would make podman try a registry)."""
    return f"localhost/trainingrun-{name}:{image_tag()}"
