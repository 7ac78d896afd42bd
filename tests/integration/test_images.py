"""The project's two images as real containers (podman + runc), built by `make images` on this machine.

- The operator image, run the way the chart's Deployment runs it: the user and the read-only root filesystem
  read from the rendered chart, /tmp as its emptyDir, in-cluster configuration from a ServiceAccount token and
  CA mounted at /var/run/secrets/kubernetes.io/serviceaccount with KUBERNETES_SERVICE_HOST/PORT, against the
  test bed's real API server with only the chart's RBAC. It drives a preemption journey (KubeRay played by the
  double, as in test_operator_chart.py), answers its liveness probe, runs as 65532 and cannot write its root.
- The runtime image: `ray start --head` and then the driver (`python -m trainingrun_runtime`, attached through
  RAY_ADDRESS as on a RayJob's head) in one container, as the image's user (1000), writing its checkpoints to a
  mounted volume; the host verifies the bundles it wrote.

The container network is the host's for the operator (the API server listens on loopback) and none at all for
the runtime (Ray needs only loopback).
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

import components
from support import containers
from support.operator_double import REPO, Cluster, KubeRayDouble, eventually, tiny_run
from trainingrun_operator.localmode import driver_process
from trainingrun_runtime.storage import layout, verification

pytestmark = [pytest.mark.containers, pytest.mark.timeout(1800)]

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def chart_objects(control_plane: Any, namespace: str, *sets: str) -> list[dict[str, Any]]:
    result = subprocess.run(
        [str(control_plane.bin_dir / "helm"), "template", "img", str(REPO / "charts" / "trainingrun"),
         "--namespace", namespace, "--kube-version", "1.35.0", *[a for s in sets for a in ("--set", s)]],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def metrics_text(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            return str(response.read().decode())
    except OSError:
        return ""


def liveness_status(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return int(response.status)
    except OSError:
        return None


@pytest.mark.cluster
def test_the_operator_image_runs_as_the_chart_says_read_only_as_65532_in_cluster_and_drives_a_run(
    control_plane: Any, namespace: str, cluster: Cluster, kuberay: KubeRayDouble, tmp_path: Path
) -> None:
    image = containers.image("operator")
    port, metrics_port = components.free_port(), components.free_port()
    objects = chart_objects(control_plane, namespace, f"watchNamespaces={{{namespace}}}",
                            "networkPolicy.enabled=false", f"livenessPort={port}",
                            f"metrics.port={metrics_port}")  # fmt: skip
    rbac = [d for d in objects if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")]
    control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rbac))
    (deployment,) = [d for d in objects if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    user = f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert [m["mountPath"] for m in container["volumeMounts"]] == ["/tmp"]  # the emptyDir: a tmpfs here

    # What the kubelet projects into the pod: the ServiceAccount's token, the cluster CA, the namespace.
    account = tmp_path / "serviceaccount"
    account.mkdir()
    sa_config = yaml.safe_load(
        control_plane.service_account_kubeconfig(namespace, pod["serviceAccountName"]).read_text()
    )
    (account / "token").write_text(sa_config["users"][0]["user"]["token"])
    (account / "ca.crt").write_bytes(Path(control_plane.ca_file).read_bytes())
    (account / "namespace").write_text(namespace)
    for f in account.iterdir():
        f.chmod(0o644)
    host, _, api_port = control_plane.server.removeprefix("https://").rpartition(":")
    env = {e["name"]: e["value"] for e in container["env"]}
    env |= {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": api_port}

    name = containers.unique_name("operator")
    started = containers.run(
        image, "--name", name, "--network", "host", "--user", user, "--read-only", "--tmpfs", "/tmp",
        "--security-opt", "no-new-privileges", "--cap-drop", "all",
        "-v", f"{account}:{SERVICE_ACCOUNT_DIR}:ro", *[a for k, v in env.items() for a in ("-e", f"{k}={v}")],
        args=container["args"], detach=True,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    try:
        eventually(lambda: liveness_status(port) == 200, what="the liveness endpoint answering 200", timeout=120)
        assert containers.exec_(name, "id", "-u").stdout.strip() == "65532"
        wrote = containers.exec_(name, "python", "-c", "open('/usr/local/probe', 'w')")
        assert wrote.returncode != 0 and "Read-only file system" in wrote.stderr, wrote.stderr
        assert containers.exec_(name, "python", "-c", "open('/tmp/probe', 'w')").returncode == 0

        cluster.apply_run(tiny_run())
        kuberay.start("tiny-a1")
        eventually(lambda: cluster.status("tiny").get("phase") == "Running", what="phase Running", timeout=120)
        cluster.report("tiny", attempt=1, step=10)
        eventually(lambda: (cluster.status("tiny").get("checkpoints") or {}).get("latest"), what="checkpoint")
        kuberay.preempt_head("tiny-a1")
        job = eventually(lambda: cluster.rayjob("tiny-a2"), what="RayJob tiny-a2 from the containerized operator")
        assert "--resume 10" in job["spec"]["entrypoint"]
        # The image serves /metrics on the chart's port (prometheus_client installed with the `operator` extra).
        preempted = f'trainingrun_attempts_ended_total{{class="Preempted",name="tiny",namespace="{namespace}"}} 1.0'
        eventually(lambda: preempted in metrics_text(metrics_port), what="the preemption in /metrics")
        control_plane.kubectl("delete", "trun", "tiny", "-n", namespace, "--wait=true", "--timeout=45s")
    finally:
        output = containers.logs(name)
        containers.remove(name)
        control_plane.kubectl("delete", "clusterrolebinding,clusterrole", "img-trainingrun", check=False)
    assert "Traceback" not in output, output[-3000:]
    assert "orbidden" not in output, output[-3000:]


def test_the_runtime_image_trains_on_a_ray_head_in_its_container_and_checkpoints_to_a_volume_as_its_user(
    tmp_path: Path,
) -> None:
    image = containers.image("runtime")
    volume = tmp_path / "checkpoints"
    volume.mkdir()
    volume.chmod(0o777)  # a PVC the pod's fsGroup may write; the container runs as the image's user
    steps = 6
    config = {
        "trainer": {"steps": steps, "promptsPerStep": 4, "generationWorkers": 1, "logEvery": 1,
                    "grpo": {"groupSize": 4}, "task": {"datasetSize": 64}},
        "checkpoint": {"savePeriod": 3, "keepLast": 5},
    }  # fmt: skip
    driver = driver_process.DriverArgs(run="boxed", attempt=1, root="/checkpoints", config=config, run_uid="uid-boxed")
    script = (
        "set -e; id -u; "
        "ray start --head --node-ip-address=127.0.0.1 --port=6379 --num-cpus=8 --disable-usage-stats "
        "--include-dashboard=false >/tmp/ray-start.log 2>&1; "
        "RAY_ADDRESS=127.0.0.1:6379 " + " ".join(json.dumps(a) for a in driver.argv(python="python"))
    )
    result = containers.run(image, "--network", "none", "--shm-size", "1g", "-v", f"{volume}:/checkpoints",
                            args=["bash", "-c", script], timeout=900)  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert result.stdout.splitlines()[0] == "1000"
    run_dir = volume / "boxed"
    for step in (3, steps):
        bundle = run_dir / layout.step_dirname(step)
        assert bundle.stat().st_uid == 1000, f"{bundle} owned by {bundle.stat().st_uid}"
        verification.open_verified(bundle)  # the host reads what the container wrote
