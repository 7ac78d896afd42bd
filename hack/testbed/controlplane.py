"""A throwaway Kubernetes control plane on 127.0.0.1: the test bed behind every `cluster` test.

Who calls it: `tests/conftest.py` (the `control_plane` fixture) and people, through

    .venv/bin/python hack/testbed/controlplane.py up [--nodes N]

which prints the admin kubeconfig path and keeps the cluster up until Ctrl-C.

What `ControlPlane.start()` runs, each in its own process group, with free ports and a private directory:

    etcd ──> kube-apiserver (RBAC+Node authz, admin token, service-account issuer and keys, the bed's CA)
               │
               ├── CRDs, applied server-side: manifests/crd/*.yaml (ours) and KubeRay's rayjobs, rayclusters,
               │   rayservices from its Go module (never copied into the repo); waited until Established
               ├── kube-controller-manager (garbage collector, node lifecycle, service accounts, Jobs, ...)
               ├── kube-scheduler
               └── kwok, playing the kubelet for the fake nodes annotated `kwok.x-k8s.io/node: fake`

This module runs that sequence and waits; the parts live next door: `components` (a process, its group, log and
port; the exit handlers), `workdirs` (the private directory), `commandlines` (each component's arguments),
`credentials` (the admin token, the service-account keys, the serving certificate), `podnet` (podman's bridge
gateway, named in that certificate), `fakenodes` (the nodes kwok plays), `kubeapi` (the
HTTPS client), `binaries` (where the binaries are) and `errors`.

Readiness is waited for (etcd /health, apiserver /readyz, controller-manager and scheduler /healthz, the
`default` ServiceAccount, every fake node Ready and untainted). `stop()` terminates every process group in
reverse order; it also runs at interpreter exit, on SIGTERM/SIGHUP, and (through PR_SET_PDEATHSIG) the children
die with their parent even if it is killed outright (its run directory then stays in $TMPDIR until the next
start sweeps it).

The binaries come from `hack/testbed/build.sh` (`make testbed`); `binaries` finds them. Standard library only,
so `up` works with any Python 3.11.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.client
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import binaries  # this directory is on sys.path: as a script, and in pytest through pyproject's `pythonpath`
import commandlines
import components
import credentials
import errors
import fakenodes
import kubeapi
import podnet
import workdirs

log = logging.getLogger(__name__)


@dataclass(eq=False)
class ControlPlane:
    """etcd, kube-apiserver, controller manager, scheduler and kwok on loopback, for one test session."""

    binaries: binaries.Binaries = field(default_factory=binaries.Binaries.locate)
    nodes: int = 1
    crd_paths: Sequence[Path] | None = None
    keep_workdir: bool = field(default_factory=lambda: os.environ.get("TESTBED_KEEP") == "1")

    workdir: Path = field(init=False)
    server: str = field(init=False, default="")
    admin_token: str = field(init=False, default="")
    kubeconfig: Path = field(init=False)
    ca_file: Path = field(init=False)
    node_names: list[str] = field(init=False, default_factory=list)
    startup_seconds: float = field(init=False, default=0.0)
    processes: list[components.Process] = field(init=False, default_factory=list)
    api: kubeapi.KubeApi = field(init=False)  # admin, verifying the API server's certificate
    _started: float = field(init=False, default=0.0, repr=False)

    # -- public surface ---------------------------------------------------------------------------------

    @property
    def bin_dir(self) -> Path:
        return self.binaries.bin_dir

    @property
    def kuberay_module_dir(self) -> Path:
        return self.binaries.kuberay_module_dir

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        self._started = started = time.monotonic()
        components.stop_on_exit(self)
        self.workdir = workdirs.create()
        try:
            self._start_all()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started
        log.info("control plane up in %.1fs at %s (kubeconfig %s)", self.startup_seconds, self.server, self.kubeconfig)
        return self

    def stop(self) -> None:
        """Stops every process group, newest first; idempotent."""
        components.forget(self)
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()
        workdir = getattr(self, "workdir", None)
        if workdir is not None and workdir.exists():
            if self.keep_workdir:
                log.warning("test-bed directory kept: %s", workdir)
            else:
                shutil.rmtree(workdir, ignore_errors=True)

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 120.0,
        kubeconfig: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Runs the pinned kubectl against this cluster (admin by default); raises KubectlError if check."""
        env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig or self.kubeconfig),
            "KUBECACHEDIR": str(self.workdir / "kube-cache"),
        }
        command = [str(self.binaries.path("kubectl")), *args]
        result = subprocess.run(command, input=input, capture_output=True, text=True, timeout=timeout, env=env)
        if check and result.returncode != 0:
            raise errors.KubectlError(f"kubectl {' '.join(args)} exited {result.returncode}: {result.stderr.strip()}")
        return result

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: str | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        """One raw API request (admin token unless `token`); returns (HTTP status, decoded body)."""
        return self.api.request(method, path, body, token=token, content_type=content_type)

    def get(self, path: str) -> dict[str, Any] | None:
        """The object at `path`, None when it does not exist (404); TestbedError on any other answer."""
        status, body = self.request("GET", path)
        if status == 404:
            return None
        if status != 200:
            raise errors.TestbedError(f"GET {path} returned {status}: {body}")
        return dict(body)

    def apply(self, *objects: dict[str, Any], namespace: str | None = None, field_manager: str | None = None) -> None:
        """`kubectl apply` of `objects` as one List (into `namespace` when given); server-side, under
        `field_manager`, when one is given."""
        args = ["--server-side", f"--field-manager={field_manager}"] if field_manager else []
        if namespace:
            args += ["-n", namespace]
        self.kubectl(
            "apply", *args, "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
        )

    def create_namespace(self, name: str, *, labels: dict[str, str] | None = None, timeout: float = 30.0) -> None:
        """Creates a namespace and waits for its `default` ServiceAccount (made by the controller manager shortly
        after), without which no pod can be created there."""
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}})
        self._wait(
            f"serviceaccount {name}/default (controller manager)",
            lambda: self.get(f"/api/v1/namespaces/{name}/serviceaccounts/default") is not None,
            timeout,
            component="kube-controller-manager",
        )

    def service_account_kubeconfig(
        self, namespace: str, name: str, *, expiration_seconds: int = 3600, audiences: Sequence[str] | None = None
    ) -> Path:
        """A kubeconfig whose token was minted for `namespace/name` through the TokenRequest API."""
        out = self.workdir / f"kubeconfig-sa-{namespace}-{name}-{uuid.uuid4().hex[:6]}"
        return kubeapi.service_account_kubeconfig(
            self.api,
            namespace,
            name,
            ca_file=self.ca_file,
            out=out,
            expiration_seconds=expiration_seconds,
            audiences=audiences,
        )

    def api_client(self, kubeconfig: Path | None = None) -> Any:
        """A `kubernetes.client.ApiClient` for this cluster (admin unless `kubeconfig`); needs the kubernetes
        package, which this module otherwise does without."""
        from kubernetes import config  # a test dependency, not one of this module's

        path = str(kubeconfig or self.kubeconfig)
        return config.new_client_from_config(config_file=path)  # type: ignore[no-untyped-call]

    def create_fake_node(self, name: str, **node_fields: Any) -> dict[str, Any]:
        """Creates a Node (see `fake_node` for the fields) and returns it as the API server stored it."""
        status, body = self.request("POST", "/api/v1/nodes", fakenodes.fake_node(name, **node_fields))
        if status != 201:
            raise errors.TestbedError(f"creating node {name} returned {status}: {body}")
        return dict(body)

    @contextlib.contextmanager
    def lone_node(self, prefix: str = "doomed", *, stages: Path | None = None) -> Iterator[fakenodes.LoneNode]:
        """A `LoneNode`, Ready; afterwards its kwok is stopped and the node deleted. `stages`: a file of kwok
        Stages for its pods (see `start_kwok`)."""
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        self.create_fake_node(
            name, taints=[fakenodes.LoneNode.taint(name)], annotations={fakenodes.KWOK_ANNOTATION: name}
        )
        kubelet = self.start_kwok(manage_single_node=name, name=f"kwok-{name}", config=stages)
        try:
            self.wait_nodes_ready([name])
            yield fakenodes.LoneNode(name, kubelet)
        finally:
            kubelet.stop()
            self.kubectl("delete", "node", name, "--ignore-not-found", check=False)

    def wait_nodes_ready(self, names: Iterable[str], timeout: float = 60.0) -> None:
        """Until each node is Ready and carries no `node.kubernetes.io/*` taint (so pods can land)."""
        pending = set(names)

        def ready() -> bool:
            for name in list(pending):
                status, node = self.request("GET", f"/api/v1/nodes/{name}")
                if status == 200 and fakenodes.node_is_schedulable(node):
                    pending.discard(name)
            return not pending

        self._wait(f"nodes {sorted(pending)} Ready (kwok)", ready, timeout, component="kwok")

    def start_kwok(
        self,
        *,
        manage_single_node: str | None = None,
        annotation: str = "fake",
        name: str = "kwok",
        config: Path | None = None,
    ) -> components.Process:
        """A kwok process: for the fake nodes annotated `KWOK_ANNOTATION: <annotation>`, or for one node (a node
        whose kubelet can die); `config`, a file of kwok Stages that replace its default pod life cycle."""
        args = commandlines.kwok(
            kubeconfig=self.kubeconfig, manage_single_node=manage_single_node, annotation=annotation, config=config
        )
        return self.spawn(name, "kwok", args)

    # -- start-up ---------------------------------------------------------------------------------------

    def _start_all(self) -> None:
        """etcd, then the API server (and the CRDs), then the controllers and kwok's nodes; each waited for."""
        sa_key, sa_pub = self.workdir / "sa.key", self.workdir / "sa.pub"
        credentials.write_rsa_pair(sa_key, sa_pub)
        etcd_url = self._start_etcd()
        self._start_apiserver(etcd_url, sa_key, sa_pub)
        # CRDs before the controller manager, so its garbage collector watches them from its first sync.
        crds = self.install_crds(
            self.crd_paths if self.crd_paths is not None else binaries.default_crd_paths(self.binaries)
        )
        log.info("%d CRDs Established after %.1fs", len(crds), time.monotonic() - self._started)
        self._start_controllers(sa_key)
        self.wait_nodes_ready(self.node_names)

    def _start_etcd(self) -> str:
        """Starts etcd and waits until it is healthy; returns its client URL."""
        etcd_port, etcd_peer = components.free_port(), components.free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        args = commandlines.etcd(
            data_dir=self.workdir / "etcd", client_url=etcd_url, peer_url=f"http://127.0.0.1:{etcd_peer}"
        )
        self.spawn("etcd", "etcd", args)
        self._wait("etcd /health", lambda: _http_ok(f"{etcd_url}/health"), 30, component="etcd")
        return etcd_url

    def _start_apiserver(self, etcd_url: str, sa_key: Path, sa_pub: Path) -> None:
        """Starts the API server with an admin token (system:masters); once it is ready, sets `server`, `ca_file`,
        `api` and the admin `kubeconfig`."""
        # The serving certificate names loopback and podman's bridge gateway, where container pods reach the API
        # server through the bed's relay (podnet.py).
        certs = self.workdir / "certs"
        self.ca_file = credentials.write_serving_certificate(certs, [g for g in [podnet.gateway()] if g])
        self.admin_token = credentials.new_token()
        tokens = credentials.write_admin_token_file(self.workdir / "tokens.csv", self.admin_token)
        api_port = components.free_port()
        self.server = f"https://127.0.0.1:{api_port}"
        args = commandlines.apiserver(
            etcd_url=etcd_url, port=api_port, cert_dir=certs, token_file=tokens, sa_key=sa_key, sa_pub=sa_pub
        )
        self.spawn("kube-apiserver", "kube-apiserver", args)
        unverified = kubeapi.KubeApi(self.server, kubeapi.insecure_context(), self.admin_token, timeout=3)
        self._wait(
            "kube-apiserver /readyz",
            functools.partial(_https_healthy, unverified, "/readyz"),
            60,
            component="kube-apiserver",
        )
        self.api = kubeapi.KubeApi(self.server, kubeapi.verified_context(self.ca_file), self.admin_token)
        self.kubeconfig = kubeapi.write_kubeconfig(
            self.workdir / "kubeconfig", server=self.server, ca_file=self.ca_file, user="admin", token=self.admin_token
        )

    def _start_controllers(self, sa_key: Path) -> None:
        """The controller manager, the scheduler, kwok and its fake nodes; waits until the controllers are up."""
        kcm_port, sched_port = components.free_port(), components.free_port()
        self._start_controller_manager(kcm_port, sa_key)
        self._start_scheduler(sched_port)
        self._start_fake_nodes()
        self._wait_controllers({"kube-controller-manager": kcm_port, "kube-scheduler": sched_port})

    def _start_controller_manager(self, port: int, sa_key: Path) -> None:
        args = commandlines.controller_manager(
            kubeconfig=self.kubeconfig,
            port=port,
            cert_dir=self.workdir / "kcm-certs",
            sa_key=sa_key,
            root_ca=self.ca_file,
        )
        self.spawn("kube-controller-manager", "kube-controller-manager", args)

    def _start_scheduler(self, port: int) -> None:
        args = commandlines.scheduler(kubeconfig=self.kubeconfig, port=port, cert_dir=self.workdir / "scheduler-certs")
        self.spawn("kube-scheduler", "kube-scheduler", args)

    def _start_fake_nodes(self) -> None:
        """The shared kwok and the `nodes` fake nodes it plays (`kwok-node-<i>`); their readiness is waited for
        last, in `_start_all`."""
        self.start_kwok()
        self.node_names = [f"kwok-node-{i}" for i in range(self.nodes)]
        for name in self.node_names:
            self.create_fake_node(name)

    def _wait_controllers(self, ports: dict[str, int]) -> None:
        """Until each controller's /healthz answers, then for the `default` ServiceAccount (the controller
        manager's first visible work)."""
        insecure = kubeapi.insecure_context()
        for component, port in ports.items():
            healthz = kubeapi.KubeApi(f"https://127.0.0.1:{port}", insecure, None, timeout=3)
            self._wait(
                f"{component} /healthz", functools.partial(_https_healthy, healthz, "/healthz"), 60, component=component
            )
        self._wait(
            "serviceaccount default/default (controller manager)",
            lambda: self.get("/api/v1/namespaces/default/serviceaccounts/default") is not None,
            60,
            component="kube-controller-manager",
        )

    def install_crds(self, paths: Sequence[Path], timeout: float = 60.0) -> list[str]:
        """Applies CRD files server-side (large KubeRay schemas exceed the client-side annotation limit) and
        waits until each is Established; returns the `customresourcedefinition/<name>` names."""
        if not paths:
            return []
        files = [arg for path in paths for arg in ("-f", str(path))]
        applied = self.kubectl(
            "apply", "--server-side", "--force-conflicts", "--field-manager=trainingrun-testbed", "-o", "name", *files
        )
        names = [line for line in applied.stdout.split() if line.startswith("customresourcedefinition")]
        # Poll the condition rather than `kubectl wait`: right after the apply a CRD can have no
        # status.conditions yet, and `kubectl wait` then fails at once with an accessor error.
        deadline = time.monotonic() + timeout
        waiting = list(names)
        while waiting:
            got = self.kubectl("get", *waiting, "-o", "json", check=False)
            doc = json.loads(got.stdout) if got.returncode == 0 else {"items": []}
            items = doc.get("items", [doc])  # one name gives the object itself, several give a List
            established = {
                item["metadata"]["name"]
                for item in items
                if any(
                    c.get("type") == "Established" and c.get("status") == "True"
                    for c in item.get("status", {}).get("conditions") or []
                )
            }
            waiting = [n for n in waiting if n.split("/", 1)[1] not in established]
            if not waiting:
                break
            if time.monotonic() > deadline:
                raise errors.KubectlError(f"CRDs not Established after {timeout:.0f}s: {', '.join(waiting)}")
            time.sleep(0.2)
        return names

    def spawn(
        self,
        name: str,
        binary: str,
        args: list[str],
        *,
        env: dict[str, str] | None = None,
        command: Sequence[str] | None = None,
    ) -> components.Process:
        """Starts one of the pinned binaries in its own process group, appending to `<workdir>/<name>.log`; it is
        stopped with the control plane (newest first), and its death fails any later readiness wait. `command`:
        the whole command line instead (a binary outside the pin set, or one wrapped in another command)."""
        log_path = self.workdir / f"{name}.log"
        with open(log_path, "ab") as log_file:
            popen = subprocess.Popen(
                list(command) if command is not None else [str(self.binaries.path(binary)), *args],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env=env,
                start_new_session=True,
                preexec_fn=components.die_with_parent(),
            )
        process = components.Process(name=name, popen=popen, log_path=log_path)
        self.processes.append(process)
        return process

    def _wait(self, what: str, probe: Callable[[], bool], timeout: float, *, component: str) -> None:
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            dead = [p for p in self.processes if not p.stopped and not p.alive()]
            if dead:
                p = dead[0]
                raise errors.TestbedError(
                    f"{p.name} exited with {p.popen.returncode} while waiting for {what}; "
                    f"log {p.log_path}:\n{p.log_tail()}"
                )
            try:
                if probe():
                    log.info("%s: ready after %.1fs", what, time.monotonic() - self._started)
                    return
            except (OSError, ValueError, http.client.HTTPException):
                pass
            if time.monotonic() > deadline:
                tails = "\n".join(
                    f"--- {p.name} ({p.log_path})\n{p.log_tail(15)}" for p in self.processes if p.name == component
                )
                raise errors.TestbedError(f"timed out after {timeout:.0f}s waiting for {what}\n{tails}")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)


def _https_healthy(api: kubeapi.KubeApi, path: str) -> bool:
    return api.request("GET", path)[0] == 200


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=3) as response:
        return bool(response.status == 200)


def raise_keyboard_interrupt(_signum: int, _frame: object) -> None:
    """A SIGTERM handler for the `up` commands: stop as on Ctrl-C, through the context managers."""
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a control plane, print its kubeconfig, wait for Ctrl-C")
    up.add_argument("--nodes", type=int, default=1, help="fake kwok nodes (default 1)")
    up.add_argument("--keep", action="store_true", help="keep the run directory (logs, kubeconfig) afterwards")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        located = binaries.Binaries.locate()
    except errors.MissingBinaries as err:
        print(err, file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, raise_keyboard_interrupt)
    with ControlPlane(located, nodes=args.nodes, keep_workdir=args.keep) as plane:
        print(plane.kubeconfig, flush=True)
        print(
            f"# up in {plane.startup_seconds:.1f}s; logs in {plane.workdir}. "
            f"export KUBECONFIG={plane.kubeconfig}  (Ctrl-C stops everything)",
            file=sys.stderr,
            flush=True,
        )
        try:
            while all(p.alive() or p.stopped for p in plane.processes):
                time.sleep(1)
            dead = next(p for p in plane.processes if not p.alive() and not p.stopped)
            print(f"{dead.name} exited; log:\n{dead.log_tail()}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 0


if __name__ == "__main__":
    sys.exit(main())
