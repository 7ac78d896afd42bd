"""The `trainingrun` command.

    trainingrun operator [--namespace NS ...] [--liveness URL] [--metrics-address HOST:PORT] [--peering NAME]
                         [--kuberay-namespace NS] [--kuberay-label KEY=VALUE ...] [--metrics-namespace NS ...]
                         [--no-network-policy] [--allow-capabilities A,B] [--allow-host-paths DIR,DIR]
                         [--kubeconfig FILE]
        the operator (kopf), as the chart's Deployment runs it; /metrics on its own port (metrics.py); each run's
        pods closed to all but the run's own, KubeRay's and the metrics namespaces' pods (netpolicy.py); the pod
        templates may add the capabilities and mount the host paths the admin allows (allowance.py), nothing else
    trainingrun run FILE [--root DIR] [--chaos]
        one TrainingRun on this machine, without Kubernetes (local.py), same decision core; it allows no added
        capability and no hostPath (there is no chart to allow one, and no pod)
    trainingrun export RUN_DIR [--step N] OUT
        a checkpoint's policy as a Hugging Face model directory (`trainingrun_runtime.export`, run in a process of
        its own: it needs the runtime's torch and transformers, which the operator never imports)

Input a command cannot use (a missing or malformed file, an invalid TrainingRun, a kubeconfig without
credentials) is one message on stderr that names the file and the line or the fields, and exit status 2, as
for a bad option; `--log-level DEBUG` adds the traceback. kopf and the Kubernetes client are imported only by
`trainingrun operator`, so local mode needs neither.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import pathlib
import sys
import threading
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from trainingrun_operator.core import allowance, errors, netpolicy

if TYPE_CHECKING:
    from trainingrun_operator.kube import apiclient, metrics

__all__ = ["main", "operate"]

logger = logging.getLogger(__name__)

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


async def operate(
    api: apiclient.Api,
    *,
    namespaces: Sequence[str] = (),
    liveness: str | None = None,
    peering: str | None = None,
    priority: int = 0,
    stop_flag: asyncio.Event | threading.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
    resync_seconds: float | None = None,
    metrics_address: str | None = None,
    exporter: metrics.Exporter | None = None,
    network: netpolicy.Sources | None = netpolicy.DEFAULT,
    allow: allowance.Allowance = allowance.NONE,
) -> None:
    """Run the operator until `stop_flag` is set (in-process: tests and the benchmark call this).

    `metrics_address` (HOST:PORT, port 0: any free one): where /metrics is served, None: nowhere; `exporter`: the
    metrics object to use (its `.port` once started), else a new one; `network`: who besides a run's own pods may
    reach them (each run's NetworkPolicy; None: none is made); `allow`: what the cluster admin allows in pod
    templates (the chart's podSecurity.allow; nothing by default).
    """
    from trainingrun_operator.kube import handlers

    await handlers.run(
        api,
        namespaces=namespaces,
        liveness=liveness,
        peering=peering,
        priority=priority,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
        resync_seconds=resync_seconds,
        metrics_address=metrics_address,
        exporter=exporter,
        network=network,
        allow=allow,
    )


def _allowance(args: argparse.Namespace) -> allowance.Allowance:
    """What the pod templates may have beyond an unprivileged pod, from the comma-separated flags."""
    try:
        capabilities = allowance.parse(capabilities=args.allow_capabilities.split(",")).capabilities
    except ValueError as exc:
        raise errors.InvalidInput(f"--allow-capabilities: {exc}") from None
    try:
        host_paths = allowance.parse(host_paths=args.allow_host_paths.split(",")).host_paths
    except ValueError as exc:
        raise errors.InvalidInput(f"--allow-host-paths: {exc}") from None
    return allowance.Allowance(capabilities, host_paths)


def _network(args: argparse.Namespace) -> netpolicy.Sources | None:
    """The sources of every run's NetworkPolicy, from the flags; None with --no-network-policy."""
    if args.no_network_policy:
        return None
    labels = dict(netpolicy.KUBERAY_LABELS)
    if args.kuberay_label:
        labels = {}
        for item in args.kuberay_label:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise errors.InvalidInput(
                    f"--kuberay-label {item}: expected KEY=VALUE, e.g. app.kubernetes.io/name=kuberay-operator"
                )
            labels[key] = value
    return netpolicy.Sources(
        kuberay_labels=labels,
        kuberay_namespace=args.kuberay_namespace or None,
        metrics_namespaces=tuple(args.metrics_namespace or ()),
    )


def _operator_command(args: argparse.Namespace) -> int:
    from trainingrun_operator.kube import apiclient, metrics

    if args.metrics_address:
        try:
            metrics.parse_address(args.metrics_address)
        except ValueError as exc:
            raise errors.InvalidInput(f"--metrics-address: {exc}") from None
    network = _network(args)
    allow = _allowance(args)

    namespaces = list(args.namespace or [])
    if not namespaces and os.environ.get("WATCH_NAMESPACES"):
        namespaces = [ns.strip() for ns in os.environ["WATCH_NAMESPACES"].split(",") if ns.strip()]
    api = apiclient.Api(apiclient.load_configuration(args.kubeconfig, args.context))
    try:
        asyncio.run(
            operate(
                api,
                namespaces=namespaces,
                liveness=args.liveness,
                peering=args.peering,
                priority=args.priority,
                metrics_address=args.metrics_address or None,
                network=network,
                allow=allow,
            )
        )
    finally:
        api.close()
    return 0


def _run_command(args: argparse.Namespace) -> int:
    from trainingrun_operator.localmode import local

    return local.run_file(pathlib.Path(args.file), root=pathlib.Path(args.root), chaos=args.chaos, seed=args.chaos_seed)


def _export_command(args: argparse.Namespace) -> int:
    import importlib.util
    import subprocess

    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
        raise errors.InvalidInput(
            "trainingrun export needs the runtime's torch and transformers: pip install 'trainingrun[runtime]'"
        )
    step = ["--step", str(args.step)] if args.step is not None else []
    command = [sys.executable, "-m", "trainingrun_runtime.export", args.run_dir, args.out, *step]
    return subprocess.run(command, check=False).returncode


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trainingrun", description=__doc__.split("\n\n")[0] if __doc__ else None)
    log_help = "DEBUG (adds the traceback to an error), INFO, WARNING, ERROR (env LOG_LEVEL)"
    parser.add_argument(
        "--log-level", type=str.upper, choices=LOG_LEVELS, default=os.environ.get("LOG_LEVEL", "INFO"), help=log_help
    )
    # Also accepted after the subcommand (`trainingrun run x.yaml --log-level DEBUG`); unset there, the above holds.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default=argparse.SUPPRESS, help=log_help)
    sub = parser.add_subparsers(dest="command", required=True)

    op = sub.add_parser("operator", parents=[common], help="run the Kubernetes operator")
    op.add_argument(
        "--namespace", "-n", action="append", help="watch only this namespace (repeatable; env WATCH_NAMESPACES)"
    )
    op.add_argument("--liveness", default="http://0.0.0.0:8080/healthz", help="kopf liveness endpoint URL")
    op.add_argument(
        "--metrics-address",
        default="0.0.0.0:8081",
        help="where /metrics is served (HOST:PORT; empty: nowhere)",
    )
    op.add_argument("--peering", default=None, help="kopf peering name: one active replica among those sharing it")
    op.add_argument("--priority", type=int, default=0, help="peering priority of this replica")
    op.add_argument(
        "--kuberay-namespace",
        default="",
        help="the KubeRay operator's namespace: only its pods there reach a run's dashboard port (default: any)",
    )
    op.add_argument(
        "--kuberay-label",
        action="append",
        metavar="KEY=VALUE",
        help="a label of the KubeRay operator's pods (repeatable; default app.kubernetes.io/name=kuberay-operator)",
    )
    op.add_argument(
        "--metrics-namespace",
        action="append",
        metavar="NS",
        help="this namespace's pods may scrape Ray's metrics port of every run (repeatable; default: none)",
    )
    op.add_argument(
        "--no-network-policy",
        action="store_true",
        help="make no NetworkPolicy per run (its pods are then as open as the namespace's own policies leave them)",
    )
    op.add_argument(
        "--allow-capabilities",
        default="",
        metavar="A,B",
        help="capabilities a pod template's container may add, e.g. IPC_LOCK (the chart's "
        "podSecurity.allow.capabilities; default: none)",
    )
    op.add_argument(
        "--allow-host-paths",
        default="",
        metavar="DIR,DIR",
        help="directories a pod template's hostPath volume may be at or under, e.g. /dev/infiniband (the chart's "
        "podSecurity.allow.hostPaths; default: none)",
    )
    op.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, then KUBECONFIG)")
    op.add_argument("--context", default=None)
    op.set_defaults(func=_operator_command)

    run = sub.add_parser("run", parents=[common], help="run a TrainingRun YAML on this machine (no Kubernetes)")
    run.add_argument("file", help="a TrainingRun YAML, e.g. manifests/examples/tiny.yaml")
    run.add_argument(
        "--root", default="runs", help="checkpoints in ROOT/local/<run>/step_N/, status in ROOT/local/<run>/status.json"
    )
    run.add_argument("--chaos", action="store_true", help="kill the driver at random moments to show a resume")
    run.add_argument("--chaos-seed", type=int, default=None, help=argparse.SUPPRESS)
    run.set_defaults(func=_run_command)

    export = sub.add_parser(
        "export", parents=[common], help="write a checkpoint's policy as a Hugging Face model directory"
    )
    export.add_argument("run_dir", help="a run's directory: ROOT/local/<run> locally, /checkpoints/<path>/<ns>/<run>")
    export.add_argument("out", help="a new (or empty) directory for the model")
    export.add_argument("--step", type=int, default=None, help="export step_N (default: the newest complete step)")
    export.set_defaults(func=_export_command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    level = getattr(logging, str(args.log_level).upper(), logging.INFO)
    logging.basicConfig(level=level, format=LOG_FORMAT, stream=sys.stderr)
    if level > logging.DEBUG:
        # kopf reports every event handler's success at INFO, aiohttp every liveness probe: noise.
        for chatty in ("kopf.objects", "aiohttp.access", "kopf.activities.probe"):
            logging.getLogger(chatty).setLevel(logging.WARNING)
    warnings.filterwarnings("once", message="Unverified HTTPS request")
    try:
        result: Any = args.func(args)
    except errors.InvalidInput as exc:
        logger.debug("trainingrun %s: the input cannot be used", args.command, exc_info=True)
        print(f"trainingrun {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return int(result)


if __name__ == "__main__":
    raise SystemExit(main())
