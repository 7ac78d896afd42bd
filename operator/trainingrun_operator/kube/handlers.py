"""kopf handlers: every trigger of the operator, and the only module that imports kopf.

Each handler is thin: it gathers, calls the kopf-free `reconciler` (which calls the pure `decision`), and maps
our errors onto kopf's. Triggers:

    startup             settings: our finalizer and annotation prefix, no kopf events, watch timeouts;
                        the metrics server (`metrics.py`) on its own port
    cleanup             the metrics server stops
    login               credentials from the same Configuration the API calls use (memo.api)
    probe               liveness: how many runs are supervised
    daemon  TrainingRun one supervisor coroutine per run: reconcile, then wait for a wake-up or the requeue
    event   TrainingRun wake the run (spec edits, the driver's status.runtime reports; not our own writes)
    event   RayJob      wake the run named by the RayJob's label (KubeRay status changes)
    event   Pod         remember a disrupted pod or a deleted worker (departures.py), wake the run named by its label
    event   Node        a node NotReady or deleted: wake every run (their pods may sit on it)
    delete  TrainingRun delete the run's RayJobs, keep the checkpoints, drop the run's series, then kopf drops
                        our finalizer

The objects handlers share live in kopf's memo (`Memo`): the Api, the wake-up signals and the metrics.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any, cast

import kopf

from trainingrun_operator.core import allowance, departures, errors, events, model, naming, netpolicy, observation
from trainingrun_operator.kube import apiclient, metrics, reconciler, wakeups

__all__ = ["FINALIZER", "PREFIX", "Memo", "NoDiffBase", "run"]

logger = logging.getLogger(__name__)

PREFIX = "trainingrun.dev"
FINALIZER = f"{PREFIX}/finalizer"
RESYNC_SECONDS = 120.0  # a pass even without events: a safety net, not the mechanism
MAX_ERROR_DELAY = 60.0
READ_AHEAD = 0.1  # a requested pass reads this much before it is due, and decides when due


@dataclasses.dataclass
class Memo:
    """What every handler shares (passed to kopf as `memo`)."""

    api: apiclient.Api
    wakeups: wakeups.Wakeups = dataclasses.field(default_factory=wakeups.Wakeups)
    departures: departures.Departures = dataclasses.field(default_factory=departures.Departures)
    clock: reconciler.Clock = reconciler.utc_now
    resync_seconds: float = RESYNC_SECONDS
    metrics: metrics.Exporter = dataclasses.field(default_factory=metrics.Exporter)
    metrics_address: str | None = None
    """Where the metrics server listens (HOST:PORT); None: no server (the Exporter still counts)."""
    network: netpolicy.Sources | None = netpolicy.DEFAULT
    """Who besides a run's own pods may reach them (each run's NetworkPolicy); None: no NetworkPolicy is made."""
    covered: set[str] = dataclasses.field(default_factory=set)
    """The uids of the runs whose NetworkPolicy this process has ensured (a run not in it gets it at its next pass)."""
    allow: allowance.Allowance = allowance.NONE
    """What the cluster admin allows in pod templates (the chart's podSecurity.allow); the rest fails InvalidSpec."""


def _memo(memo: Any) -> Memo:
    assert isinstance(memo, Memo), "run the operator through cli.operate(), which passes a handlers.Memo"
    return memo


def _ns(namespace: str | None) -> str:
    return namespace or "default"


class NoDiffBase(kopf.DiffBaseStorage):
    """No "last handled configuration" kept on the TrainingRun.

    kopf keeps a copy of each object's spec (an annotation by default) to tell creations from updates for its
    create/update handlers. We have none (the daemon reconciles every change), but the on.delete handler made
    kopf write that annotation anyway: one more patch per created run, carrying the whole spec, and one more
    watch event for every watcher. With nothing fetched, kopf sees no update to tell apart; deletion is
    detected from deletionTimestamp, not from this.
    """

    def build(self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None) -> kopf.BodyEssence:
        # kopf builds an essence (a deep copy of the object, status aside) on every watch event of every kind it
        # watches, pods and RayJobs included, only to diff it against what fetch() returns: nothing to compare.
        return cast(kopf.BodyEssence, {})

    def fetch(self, *, body: kopf.Body) -> None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.posting.enabled = False  # our own events, with our reasons, come from reconciler.py
    # No cluster-wide scanning of namespaces and CRDs: it would need list/watch on both (least privilege). The
    # price: a CRD installed after start-up (e.g. KubeRay's) is served after the next operator restart.
    settings.scanning.disabled = True
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 30


@kopf.on.startup()
def serve_metrics(memo: Any, **_: Any) -> None:
    """Serve /metrics; a port that cannot be had stops the operator at start-up (kopf would retry forever)."""
    memo = _memo(memo)
    if memo.metrics_address:
        try:
            port = memo.metrics.start(memo.metrics_address)
        except OSError as exc:
            raise kopf.PermanentError(f"cannot serve /metrics on {memo.metrics_address}: {exc}") from exc
        logger.info("serving /metrics on %s (port %d)", memo.metrics_address, port)


@kopf.on.cleanup()
def stop_metrics(memo: Any, **_: Any) -> None:
    _memo(memo).metrics.stop()


@kopf.on.login()
def login(memo: Any, **_: Any) -> kopf.ConnectionInfo:
    config = _memo(memo).api.configuration
    header = config.get_api_key_with_prefix("BearerToken") or config.get_api_key_with_prefix("authorization")
    scheme, _sep, token = (header or "").rpartition(" ")
    return kopf.ConnectionInfo(
        server=config.host,
        ca_path=config.ssl_ca_cert,
        insecure=not config.verify_ssl,
        scheme=scheme or ("Bearer" if token else None),
        token=token or None,
        certificate_path=config.cert_file,
        private_key_path=config.key_file,
        username=config.username or None,
        password=config.password or None,
    )


@kopf.on.probe(id="supervised_runs")
def supervised_runs(memo: Any, **_: Any) -> int:
    return len(_memo(memo).wakeups)


@kopf.daemon(model.GROUP, model.VERSION, model.PLURAL, cancellation_timeout=10.0)
async def supervise(
    name: str, namespace: str | None, body: kopf.Body, memo: Any, stopped: kopf.DaemonStopped, **_: Any
) -> None:
    """Reconcile this run whenever woken, or when the last pass asked to be called back.

    A pass that was asked for (a backoff's end) starts `READ_AHEAD` seconds early: it reads the run, its
    RayJobs and pods, then decides at the due moment (see `reconciler.reconcile`'s `not_before`), so the
    next attempt's RayJob is not one more round of reads late. A pass that fails, with our error or any other
    (a bug), is retried after a capped exponential backoff: the run stays supervised until it is deleted.
    """
    memo, namespace = _memo(memo), _ns(namespace)
    wake = memo.wakeups.event(namespace, name)
    failures = 0
    due: float | None = None
    while not stopped:
        wake.clear()
        try:
            requeue = await reconciler.reconcile(
                memo.api,
                namespace,
                name,
                memo.clock,
                memo.departures,
                memo.wakeups,
                not_before=due,
                metrics=memo.metrics,
                network=memo.network,
                covered=memo.covered,
                allow=memo.allow,
            )
            failures = 0
        except asyncio.CancelledError:
            raise
        except errors.OperatorError as exc:
            failures += 1
            requeue = _backoff(failures) if exc.retryable else MAX_ERROR_DELAY
            logger.warning("%s/%s: reconcile failed (%s), retrying in %.1fs", namespace, name, exc, requeue)
        except Exception as exc:  # a bug in one pass must not end the run's supervision
            failures += 1
            requeue = _backoff(failures)
            logger.exception("%s/%s: reconcile failed unexpectedly, retrying in %.1fs", namespace, name, requeue)
            await _post_failure(memo.api, body, exc, requeue)
        due = time.monotonic() + requeue if requeue is not None else None
        timeout = max(0.0, requeue - READ_AHEAD) if requeue is not None else memo.resync_seconds
        await wakeups.wait_any(wake.wait(), stopped.wait(), timeout=timeout)


def _backoff(failures: int) -> float:
    """Seconds before the next pass after `failures` failed passes in a row: 1, 2, 4, ... up to MAX_ERROR_DELAY."""
    return min(MAX_ERROR_DELAY, 0.5 * 2.0 ** min(failures, 16))  # the exponent bounded: 2.0**1024 overflows


async def _post_failure(api: apiclient.Api, run: kopf.Body, exc: Exception, requeue: float) -> None:
    """A Warning event on `run` for a pass that failed unexpectedly; best effort, as every event we post."""
    message = f"reconcile failed unexpectedly ({type(exc).__name__}: {exc}); retrying in {requeue:.1f}s"
    try:
        await api.post_event(run, events.Type.WARNING, events.Reason.FAILED_TO_RECONCILE, message)
    except Exception as post_exc:  # the run's supervision outlives its events
        logger.warning(
            "%s/%s: could not post event %s: %s",
            run.metadata.namespace,
            run.metadata.name,
            events.Reason.FAILED_TO_RECONCILE,
            post_exc,
        )


# The event handlers are coroutines on purpose: kopf runs plain functions in a thread pool, and the wake-up
# signals (asyncio.Event) and the departures memory must only be touched on the event loop.


@kopf.on.event(model.GROUP, model.VERSION, model.PLURAL)
async def run_changed(name: str, namespace: str | None, body: kopf.Body, memo: Any, **_: Any) -> None:
    memo, namespace = _memo(memo), _ns(namespace)
    if memo.wakeups.is_news(namespace, name, body):  # not our own status write or kopf's finalizer
        memo.wakeups.wake(namespace, name)


@kopf.on.event("ray.io", "v1", "rayjobs", labels={naming.LABEL_RUN: kopf.PRESENT})
async def rayjob_changed(labels: kopf.Labels, namespace: str | None, memo: Any, **_: Any) -> None:
    _memo(memo).wakeups.wake(_ns(namespace), labels[naming.LABEL_RUN])


@kopf.on.event("", "v1", "pods", labels={naming.LABEL_RUN: kopf.PRESENT})
async def pod_changed(labels: kopf.Labels, namespace: str | None, body: kopf.Body, memo: Any, **_: Any) -> None:
    memo, namespace, run = _memo(memo), _ns(namespace), labels[naming.LABEL_RUN]
    seen = observation.pod_observation(body, None)
    memo.departures.record(namespace, run, labels.get(naming.LABEL_ATTEMPT, ""), seen)
    memo.wakeups.wake(namespace, run)


@kopf.on.event("", "v1", "nodes")
async def node_changed(type: str, status: kopf.Status, memo: Any, **_: Any) -> None:
    ready = next((c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    if type == "DELETED" or ready != "True":
        _memo(memo).wakeups.wake_all()


@kopf.on.delete(model.GROUP, model.VERSION, model.PLURAL)
async def cleanup(name: str, namespace: str | None, uid: str | None, memo: Any, **_: Any) -> None:
    """Delete the run's RayJobs; the checkpoint PVC is not the run's, so it stays. The run's series go."""
    memo, namespace = _memo(memo), _ns(namespace)
    try:
        deleted = await reconciler.finalize(memo.api, namespace, name)
    except errors.ApiError as exc:
        raise kopf.TemporaryError(str(exc), delay=5) from exc
    memo.wakeups.forget(namespace, name)
    memo.departures.forget(namespace, name)
    memo.metrics.forget(namespace, name, uid)
    memo.covered.discard(uid or "")
    logger.info("%s/%s deleted; removed RayJobs %s, kept checkpoints", namespace, name, deleted or "none")


async def run(
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
    """Run kopf with the handlers above until `stop_flag` is set. No namespaces: every namespace.

    `metrics_address` (HOST:PORT): where /metrics is served, None: nowhere; `exporter`: the metrics to keep (a
    test reads its port or registry), else a new one; `network`: the sources of every run's NetworkPolicy (None:
    none is made); `allow`: what the cluster admin allows in pod templates (nothing by default).
    """
    memo = Memo(api=api, metrics_address=metrics_address, network=network, allow=allow)
    if exporter is not None:
        memo.metrics = exporter
    if resync_seconds is not None:
        memo.resync_seconds = resync_seconds
    await kopf.operator(
        standalone=peering is None,
        peering_name=peering,
        priority=priority,
        liveness_endpoint=liveness,
        clusterwide=not namespaces,
        namespaces=list(namespaces),
        memo=memo,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )
