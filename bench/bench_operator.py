"""Benchmark (not a test): the operator's reaction times and memory against a real API server, side by side with
KubeRay's own controller and with a bare kopf handler, measured in one run on one test bed.

Side by side, not in turns: the three controllers run at the same time, each watching its own namespace, and
are fed at the same moments (`--rate` objects per second each, creations interleaved in a rotating order), so
that the same API server, the same machine load and the same noise fall on all three. Every latency runs from
the moment the client sends the create to the moment a watch on the same API server sees the result:

- apply -> RayJob: a TrainingRun is created; our operator (`trainingrun operator`, a subprocess) creates the
  attempt's RayJob. p50, p90 and p99 over `--runs` runs.
- the peer, KubeRay's RayJob -> RayCluster: the real KubeRay v1.5.0 operator (from the test bed,
  `--watch-namespace` its own) creates the RayCluster of each of `--runs` RayJobs (InteractiveMode).
- the floor of the framework: a bare kopf operator whose only handler creates one ConfigMap per custom object.

Then, with the two peers stopped, our operator alone:
- failure -> next RayJob, beyond the backoff: a RayJob is marked failed (as KubeRay does: Failed/AppFailed);
  the time until the next attempt's RayJob appears, minus the configured backoff (0.5 s). One at a time.
- operator RSS (VmRSS of the process) with `--runs` and with `--total` TrainingRuns supervised.

The machine's load average (1/5/15 min) is recorded before and after each part: on the shared 2-core machine
the absolute figures move with it, the ratios much less.

Goals (issue 5): apply p99 <= 2x KubeRay's p99 in the same run; failure -> next within 200 ms beyond the
backoff; RSS < 200 MB at 500 runs. The ratios are printed and merged into `bench-results.json` at the
repository root under "operator" (read-modify-write; other benchmarks keep their keys).

Run: `.venv/bin/python bench/bench_operator.py [--runs 200] [--total 500] [--failures 20] [--rate 5]`
(needs the test bed: `make testbed`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes.client
import kubernetes.watch
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "hack" / "testbed"))

import results  # noqa: E402  (bench/results.py: bench-results.json)

import components  # noqa: E402  (hack/testbed is not a package)
import controlplane  # noqa: E402

BACKOFF_SECONDS = 0.5


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/PID/stat, clock ticks)."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class Seen:
    """A watch in a thread: the first time (perf_counter) each object name was seen."""

    def __init__(self, list_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.first: dict[str, float] = {}
        self._watch = kubernetes.watch.Watch()
        self._thread = threading.Thread(target=self._run, args=(list_fn, args, kwargs), daemon=True)
        self._thread.start()
        time.sleep(0.5)  # the watch is established before anything is created

    def _run(self, list_fn: Callable[..., Any], args: Any, kwargs: Any) -> None:
        with contextlib.suppress(Exception):  # the stream ends with an error when stop() closes it
            for event in self._watch.stream(list_fn, *args, **kwargs):
                obj = event["object"]
                name = obj["metadata"]["name"] if isinstance(obj, dict) else obj.metadata.name
                self.first.setdefault(name, time.perf_counter())

    def wait_for(self, names: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while any(n not in self.first for n in names):
            if time.monotonic() > deadline:
                missing = [n for n in names if n not in self.first]
                raise TimeoutError(f"{len(missing)} never seen, e.g. {missing[:3]}")
            time.sleep(0.05)

    def stop(self) -> None:
        self._watch.stop()


def paced(names: list[str], rate: float, create: Callable[[str], object]) -> dict[str, float]:
    """Create one object per name at `rate` per second; returns the send time (perf_counter) of each."""
    sent: dict[str, float] = {}
    start = time.perf_counter()
    for i, name in enumerate(names):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        sent[name] = time.perf_counter()
        create(name)
    return sent


@contextlib.contextmanager
def process(argv: list[str], env: dict[str, str], log: pathlib.Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def namespace(plane: Any, name: str) -> str:
    plane.kubectl("create", "namespace", name)
    deadline = time.monotonic() + 30
    while plane.request("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default")[0] != 200:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no default ServiceAccount in {name}")
        time.sleep(0.1)
    return name


def delete_namespace(plane: Any, name: str, timeout: float = 300) -> None:
    """Delete a namespace and wait until it is gone, so the next phase starts on a quiet API server."""
    plane.kubectl("delete", "namespace", name, "--wait=false")
    deadline = time.monotonic() + timeout
    while plane.request("GET", f"/api/v1/namespaces/{name}")[0] != 404:
        if time.monotonic() > deadline:
            raise TimeoutError(f"namespace {name} still there after {timeout}s")
        time.sleep(0.5)


def training_run(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "manifests" / "examples" / "tiny.yaml").read_text())
    doc["metadata"] = {"name": name}
    doc["spec"]["restartPolicy"] = {
        "failureBudget": 3,
        "backoff": {"initialSeconds": BACKOFF_SECONDS, "maxSeconds": BACKOFF_SECONDS, "factor": 1},
    }
    return dict(doc)


def bare_rayjob(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name},
        "spec": {
            # InteractiveMode: KubeRay creates the RayCluster and then waits; no job submission to a dashboard
            # that does not exist here, which would slow its single reconcile worker and be unfair to it.
            "entrypoint": "python -c 'print(1)'",
            "submissionMode": "InteractiveMode",
            "shutdownAfterJobFinishes": True,
            "rayClusterSpec": {
                "headGroupSpec": {
                    "rayStartParams": {},
                    "template": {"spec": {"containers": [{"name": "ray-head", "image": "rayproject/ray:2.60.0"}]}},
                }
            },
        },
    }


# ------------------------------------------------------------------------------------------- the phases


BARE_KOPF = textwrap.dedent("""
    import kopf, kubernetes

    @kopf.on.startup()
    def configure(settings, **_):
        settings.posting.enabled = False
        settings.scanning.disabled = True
        kubernetes.config.load_kube_config()

    @kopf.on.create("bench.trainingrun.dev", "v1", "benchobjects")
    def create(name, namespace, **_):
        body = {"metadata": {"name": name}, "data": {"k": "v"}}
        kubernetes.client.CoreV1Api().create_namespaced_config_map(namespace, body)
""")

BENCH_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "benchobjects.bench.trainingrun.dev"},
    "spec": {
        "group": "bench.trainingrun.dev",
        "scope": "Namespaced",
        "names": {"kind": "BenchObject", "plural": "benchobjects", "singular": "benchobject"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
            }
        ],
    },
}


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def wait_healthy(port: int, what: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        with contextlib.suppress(OSError):
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2).status == 200:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: liveness endpoint never answered")
        time.sleep(0.2)


@dataclasses.dataclass
class Side:
    """One of the three controllers under test: how to create one object, the watch that sees the result,
    and the result's name for an object's name."""

    label: str
    create: Callable[[str], object]
    seen: Seen
    result_of: Callable[[str], str]


def side_by_side(sides: list[Side], runs: int, rate: float) -> dict[str, dict[str, float]]:
    """Create `runs` objects on every side, interleaved: at each tick (`rate` per second per side) one object
    per side, the order rotating so no side is always first. Every side sees the same API server, the same
    machine load and the same moments. Returns, per side, its object name -> the send time (perf_counter)."""
    sent: dict[str, dict[str, float]] = {side.label: {} for side in sides}
    start = time.perf_counter()
    for i in range(runs):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        for k in range(len(sides)):
            side = sides[(i + k) % len(sides)]
            name = f"{side.label[0]}{i:03d}"
            sent[side.label][name] = time.perf_counter()
            side.create(name)
    return sent


def bench_side_by_side(
    plane: Any,
    runs: int,
    rate: float,
    work: pathlib.Path,
    peers: contextlib.ExitStack,
    ours_stack: contextlib.ExitStack,
) -> tuple[dict[str, Any], int]:
    """KubeRay, the bare kopf floor and our operator, running and fed at the same time. The peers' processes
    go on `peers`, ours on `ours_stack` (it keeps running for the later phases); returns the figures and our pid."""
    client = plane.api_client()
    custom, core = kubernetes.client.CustomObjectsApi(client), kubernetes.client.CoreV1Api(client)
    ns_kuberay, ns_kopf, ns_ours = (namespace(plane, n) for n in ("bench-kuberay", "bench-kopf", "bench-operator"))
    plane.kubectl("apply", "-f", "-", input=json.dumps(BENCH_CRD))
    plane.kubectl("wait", "--for=condition=Established", "crd/benchobjects.bench.trainingrun.dev", "--timeout=60s")

    kuberay = peers.enter_context(
        process(
            [
                str(plane.bin_dir / "kuberay-operator"),
                "--kubeconfig",
                str(plane.kubeconfig),
                "--enable-leader-election=false",
                "--metrics-addr",
                "0",
                "--health-probe-bind-address",
                "0",
                "--watch-namespace",
                ns_kuberay,
            ],
            {**os.environ, "NO_PROXY": "127.0.0.1,localhost"},
            work / "kuberay.log",
        )
    )
    script = work / "bare_kopf.py"
    script.write_text(BARE_KOPF)
    kopf_port, our_port = components.free_port(), components.free_port()
    bare = peers.enter_context(
        process(
            [
                sys.executable,
                "-m",
                "kopf",
                "run",
                "--standalone",
                "-n",
                ns_kopf,
                "--log-format=plain",
                "-q",
                f"--liveness=http://127.0.0.1:{kopf_port}/healthz",
                str(script),
            ],
            {**os.environ, "KUBECONFIG": str(plane.kubeconfig)},
            work / "bare_kopf.log",
        )
    )
    ours = ours_stack.enter_context(
        process(
            [
                str(ROOT / ".venv" / "bin" / "trainingrun"),
                "--log-level",
                "WARNING",
                "operator",
                "--kubeconfig",
                str(plane.kubeconfig),
                "-n",
                ns_ours,
                "--liveness",
                f"http://127.0.0.1:{our_port}/healthz",
                "--metrics-address",
                f"127.0.0.1:{components.free_port()}",
            ],
            dict(os.environ),
            work / "operator.log",
        )
    )
    wait_healthy(kopf_port, "bare kopf")
    wait_healthy(our_port, "trainingrun operator")
    time.sleep(5)  # KubeRay's caches synced (it has no probe here)

    clusters: dict[str, str] = {}

    def cluster_of(name: str) -> str:
        while name not in clusters:  # KubeRay names the cluster <rayjob>-<5 random chars>; read it from the RayJob
            status = (
                custom.get_namespaced_custom_object("ray.io", "v1", ns_kuberay, "rayjobs", name).get("status") or {}
            )
            if status.get("rayClusterName"):
                clusters[name] = str(status["rayClusterName"])
            else:
                time.sleep(0.05)
        return clusters[name]

    kopf_body = lambda n: {"apiVersion": "bench.trainingrun.dev/v1", "kind": "BenchObject", "metadata": {"name": n}}  # noqa: E731
    sides = [
        Side(
            "kuberay",
            lambda n: custom.create_namespaced_custom_object("ray.io", "v1", ns_kuberay, "rayjobs", bare_rayjob(n)),
            Seen(custom.list_namespaced_custom_object, "ray.io", "v1", ns_kuberay, "rayclusters"),
            cluster_of,
        ),
        Side(
            "bare-kopf",
            lambda n: custom.create_namespaced_custom_object(
                "bench.trainingrun.dev", "v1", ns_kopf, "benchobjects", kopf_body(n)
            ),
            Seen(core.list_namespaced_config_map, ns_kopf),
            lambda n: n,
        ),
        Side(
            "ours",
            lambda n: custom.create_namespaced_custom_object(
                "trainingrun.dev", "v1alpha1", ns_ours, "trainingruns", training_run(n)
            ),
            Seen(custom.list_namespaced_custom_object, "ray.io", "v1", ns_ours, "rayjobs"),
            lambda n: f"{n}-a1",
        ),
    ]
    procs = {"kuberay": kuberay, "bare-kopf": bare, "ours": ours}
    cpu_before = {label: cpu_seconds(proc.pid) for label, proc in procs.items()}
    load_before = load()
    sent = side_by_side(sides, runs, rate)
    load_after = load()
    figures: dict[str, Any] = {"load_before": load_before, "load_after": load_after}
    for side in sides:
        names = list(sent[side.label])
        results = {n: side.result_of(n) for n in names}
        side.seen.wait_for(list(results.values()), timeout=180)
        values = [(side.seen.first[results[n]] - t) * 1000 for n, t in sent[side.label].items()]
        figures[side.label] = {
            "p50": percentile(values, 50),
            "p90": percentile(values, 90),
            "p99": percentile(values, 99),
        }
        side.seen.stop()
    # CPU per created object (until all were handled, plus the follow-up work of the next 5 s): unlike the
    # latencies, hardly moved by the machine's load.
    time.sleep(5)
    for label, proc in procs.items():
        figures[label]["rss_mb"] = rss_mb(proc.pid)
        figures[label]["cpu_ms_per_object"] = (cpu_seconds(proc.pid) - cpu_before[label]) * 1000 / runs
    return figures, ours.pid


def bench_failures_and_memory(
    plane: Any, pid: int, runs: int, total: int, failures: int, rate: float
) -> dict[str, Any]:
    """Our operator alone (the others stopped): failure -> next RayJob, one at a time; then RSS at `total` runs."""
    ns = "bench-operator"
    custom = kubernetes.client.CustomObjectsApi(plane.api_client())
    jobs = Seen(custom.list_namespaced_custom_object, "ray.io", "v1", ns, "rayjobs")
    figures: dict[str, Any] = {"load_before": load()}
    beyond = []
    for i in range(failures):
        name = f"o{i:03d}"
        failed = {
            "status": {
                "jobDeploymentStatus": "Failed",
                "jobStatus": "FAILED",
                "reason": "AppFailed",
                "message": "Job entrypoint command failed with exit code 1",
            }
        }
        t0 = time.perf_counter()
        custom.patch_namespaced_custom_object_status(
            "ray.io", "v1", ns, "rayjobs", f"{name}-a1", failed, _content_type="application/merge-patch+json"
        )
        jobs.wait_for([f"{name}-a2"], timeout=60)
        beyond.append((jobs.first[f"{name}-a2"] - t0 - BACKOFF_SECONDS) * 1000)
    figures["failure_p50"], figures["failure_p99"] = percentile(beyond, 50), percentile(beyond, 99)
    figures["failure_max"] = max(beyond)

    def create(n: str) -> None:
        custom.create_namespaced_custom_object("trainingrun.dev", "v1alpha1", ns, "trainingruns", training_run(n))

    more = [f"o{i:03d}" for i in range(runs, total)]
    paced(more, rate, create)
    jobs.wait_for([f"{n}-a1" for n in more], timeout=300)
    time.sleep(10)
    figures["rss_total"] = rss_mb(pid)
    figures["load_after"] = load()
    jobs.stop()
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--total", type=int, default=500)
    parser.add_argument(
        "--failures", type=int, default=50, help="failures, one at a time (p99 of 20 would be their maximum)"
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=5.0,
        help="creations per second, for all three (paced, so that latency and not a backlog is measured)",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-op-") as tmp, controlplane.ControlPlane(nodes=1) as plane:
        work = pathlib.Path(tmp)
        with contextlib.ExitStack() as ours_stack:
            with contextlib.ExitStack() as peers:
                side, pid = bench_side_by_side(plane, args.runs, args.rate, work, peers, ours_stack)
            alone = bench_failures_and_memory(plane, pid, args.runs, args.total, args.failures, args.rate)
            delete_namespace(plane, "bench-operator")  # while the operator runs: it removes its finalizers
    ours, kuberay, bare = side["ours"], side["kuberay"], side["bare-kopf"]
    figures = {
        "runs": args.runs,
        "rate_per_side": args.rate,
        "method": "side by side: all three controllers run at once, creations interleaved (rotating order)",
        "load_avg_1_5_15_side_by_side": f"{side['load_before']} -> {side['load_after']}",
        "load_avg_1_5_15_failures_and_memory": f"{alone['load_before']} -> {alone['load_after']}",
        "apply_to_rayjob_p50_ms": round(ours["p50"], 1),
        "apply_to_rayjob_p90_ms": round(ours["p90"], 1),
        "apply_to_rayjob_p99_ms": round(ours["p99"], 1),
        "kuberay_rayjob_to_raycluster_p50_ms": round(kuberay["p50"], 1),
        "kuberay_rayjob_to_raycluster_p90_ms": round(kuberay["p90"], 1),
        "kuberay_rayjob_to_raycluster_p99_ms": round(kuberay["p99"], 1),
        "bare_kopf_create_p50_ms": round(bare["p50"], 1),
        "bare_kopf_create_p99_ms": round(bare["p99"], 1),
        "apply_p99_vs_kuberay_p99": round(ours["p99"] / kuberay["p99"], 2),
        "apply_p50_vs_kuberay_p50": round(ours["p50"] / kuberay["p50"], 2),
        "apply_p99_vs_bare_kopf_p99": round(ours["p99"] / bare["p99"], 2),
        "failure_to_next_rayjob_ms_beyond_backoff": round(alone["failure_p99"], 1),
        "failure_to_next_rayjob_ms_beyond_backoff_p50": round(alone["failure_p50"], 1),
        "failure_to_next_rayjob_ms_beyond_backoff_max": round(alone["failure_max"], 1),
        "backoff_seconds": BACKOFF_SECONDS,
        "operator_cpu_ms_per_run": round(ours["cpu_ms_per_object"], 1),
        "kuberay_cpu_ms_per_rayjob": round(kuberay["cpu_ms_per_object"], 1),
        "bare_kopf_cpu_ms_per_object": round(bare["cpu_ms_per_object"], 1),
        f"operator_rss_mb_{args.runs}_runs": round(ours["rss_mb"], 1),
        f"operator_rss_mb_{args.total}_runs": round(alone["rss_total"], 1),
        "operator_rss_mb_500_runs": round(alone["rss_total"], 1) if args.total == 500 else None,
        f"kuberay_rss_mb_{args.runs}_rayjobs": round(kuberay["rss_mb"], 1),
        f"bare_kopf_rss_mb_{args.runs}_objects": round(bare["rss_mb"], 1),
        "goals": {
            "apply_p99_vs_kuberay_p99": "<= 2.0",
            "failure_to_next_rayjob_ms_beyond_backoff": "<= 200",
            "operator_rss_mb_500_runs": "< 200",
        },
    }
    results.merge("operator", figures)
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
