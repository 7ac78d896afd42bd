"""KubeRay's `ray start` command for a pod, rewritten for a local process: the pod runner's command line for Ray.

Who uses it: `podrunner.PodRunner._launch`. Pure: it builds argument lists and does no I/O.

KubeRay writes the pod's whole `ray start` command into the container's KUBERAY_GEN_RAY_START_CMD variable. The
user's parameters in it (`--num-cpus=1`, `--resources=...`) are kept; those that describe the container's network
or files (ports, addresses, the temp dir) are replaced by the runner's own, because every pod here shares one
loopback interface and one filesystem:

    ray start --head --block --dashboard-host=0.0.0.0 --num-cpus=1        (KUBERAY_GEN_RAY_START_CMD)
      -> <venv>/bin/ray start --block --disable-usage-stats --node-ip-address=127.0.0.1 --temp-dir=/tmp/rpXXXX
         --dashboard-agent-listen-port=<free> --head --port=<free> --dashboard-host=127.0.0.1
         --dashboard-port=<free> --ray-client-server-port=<free> --num-cpus=1 --object-store-memory=<bytes>
"""

from __future__ import annotations

import shlex
from pathlib import Path

# KubeRay's container ports (constant.go); a pod's `ports` maps each to the local port the runner chose for it.
GCS_PORT, DASHBOARD_PORT, CLIENT_PORT, AGENT_PORT = 6379, 8265, 10001, 52365
CONTAINER_PORTS = (GCS_PORT, DASHBOARD_PORT, CLIENT_PORT, AGENT_PORT)
# `ray start` parameters that describe the container's network or files; the runner chooses its own.
RUNNER_OWNED_PARAMS = frozenset(
    {
        "head",
        "block",
        "address",
        "port",
        "node-ip-address",
        "temp-dir",
        "dashboard-host",
        "dashboard-port",
        "dashboard-agent-listen-port",
        "dashboard-agent-grpc-port",
        "metrics-export-port",
        "ray-client-server-port",
        "node-manager-port",
        "object-manager-port",
        "runtime-env-agent-port",
        "min-worker-port",
        "max-worker-port",
        "worker-port-list",
        "disable-usage-stats",
    }
)
# Flags whose value "true" is written out (`--log-color=true`): they take a value, they are not switches.
_VALUED_BOOLEANS = frozenset({"log-color", "include-dashboard"})


def parse(command: str) -> dict[str, str]:
    """`ray start --head --num-cpus=2 --block` -> {"head": "true", "num-cpus": "2", "block": "true"}."""
    params: dict[str, str] = {}
    words = shlex.split(command)
    i = 0
    while i < len(words):
        word = words[i]
        if word.startswith("--"):
            key, sep, value = word[2:].partition("=")
            if not sep and i + 1 < len(words) and not words[i + 1].startswith("--"):
                value, i = words[i + 1], i + 1
            params[key] = value if (sep or value) else "true"
        i += 1
    return params


def user_args(params: dict[str, str]) -> list[str]:
    """The user's `ray start` parameters as flags, without the ones the runner owns."""
    args = []
    for key in sorted(params):
        if key in RUNNER_OWNED_PARAMS:
            continue
        value = params[key]
        args.append(f"--{key}" if value.lower() == "true" and key not in _VALUED_BOOLEANS else f"--{key}={value}")
    return args


def command(
    ray: Path,
    generated: str,
    *,
    ports: dict[int, int],
    temp_dir: Path,
    head_gcs_address: str | None,
    object_store_bytes: int,
) -> list[str]:
    """The local `ray start` for a pod: a head when `head_gcs_address` is None, else a worker joining that GCS.
    `generated` is KubeRay's KUBERAY_GEN_RAY_START_CMD ("" when absent); `ports` maps CONTAINER_PORTS to the
    local ports chosen for this pod."""
    params = parse(generated) if generated else {}
    params.setdefault("object-store-memory", str(object_store_bytes))
    args = [
        str(ray),
        "start",
        "--block",
        "--disable-usage-stats",
        "--node-ip-address=127.0.0.1",
        f"--temp-dir={temp_dir}",
        f"--dashboard-agent-listen-port={ports[AGENT_PORT]}",
    ]
    if head_gcs_address is None:
        args += [
            "--head",
            f"--port={ports[GCS_PORT]}",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={ports[DASHBOARD_PORT]}",
            f"--ray-client-server-port={ports[CLIENT_PORT]}",
        ]
    else:
        args.append(f"--address={head_gcs_address}")
    return args + user_args(params)
