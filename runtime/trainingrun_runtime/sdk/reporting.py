"""Reporters: how the driver tells the world about progress and completed checkpoints.

    controller: checkpoint renamed to step_N ─► report(status) ─► KubernetesReporter: merge patch status.runtime
                step done (≤ 1 per period)   ─┘                └► FileReporter: <root>/<run>/attempts/<N>/runtime.json

The driver writes only `status.runtime` (one writer per field; the operator owns the
rest of the status). `lastCheckpoint` changes only after a checkpoint's rename, so a
reported checkpoint always exists; `step` is the newest step the attempt finished, so
the operator can tell how many steps an interrupted attempt lost (`stepsLost`:
`step` minus the newest recorded checkpoint). Its shape is `contract.RuntimeStatus`, which
the operator reads.

`ProgressReports` sends them: a checkpoint report right away (after any report in
flight), a progress report after a step at most once per period (default 1 s) and at
most one period late, never blocking the training step and never two at once, so a
report never lands out of order. Every report is built when it is sent.

The Kubernetes reporter authenticates as the pod's service account (in-cluster
config) and falls back to `KUBECONFIG` (the test bed). A failed report is logged
and retried on the next one; it never stops training. Imports `kubernetes` lazily,
so the file reporter works without it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from trainingrun_runtime import contract
from trainingrun_runtime.storage import files

__all__ = [
    "ORPHANS_LISTED",
    "PROGRESS_PERIOD_S",
    "FileReporter",
    "KubernetesReporter",
    "OperatorView",
    "ProgressReports",
    "Reporter",
    "build",
]

log = logging.getLogger(__name__)

PROGRESS_PERIOD_S = 1.0
"""Default: at most one progress report per second (checkpoint reports are never held back)."""

GROUP = "trainingrun.dev"
VERSION = "v1alpha1"
PLURAL = "trainingruns"
ORPHANS_LISTED = 100
"""At most this many set-aside steps are listed in `status.runtime.orphanedCheckpoints` (the CRD's maxItems)."""


@dataclasses.dataclass(frozen=True)
class OperatorView:
    """What the operator's part of the status says about this run, as the driver reads it before retention."""

    attempt: int | None
    """The operator's current attempt number (None: none recorded yet)."""
    attempt_ended: bool
    """Whether the operator has ended that attempt (preempted, failed, suspended, succeeded)."""
    pinned: int | None
    """The step the next attempt would resume from: the newest recorded checkpoint not marked bad."""
    recorded: frozenset[int] = frozenset()
    """Every step the status records (latest and history, bad ones too)."""
    supervised: bool = True
    """False when there is no status at all (a bare driver, no supervisor): then it records nothing, not even that
    a step is unrecorded."""

    @classmethod
    def of(cls, status: Mapping[str, Any]) -> OperatorView:
        attempt = status.get("attempt") or {}
        book = status.get("checkpoints") or {}
        bad = set(book.get("bad") or [])
        recorded = [c.get("step") for c in [*(book.get("history") or []), book.get("latest") or {}]]
        good = [s for s in recorded if isinstance(s, int) and s not in bad]
        number = attempt.get("number")
        return cls(
            attempt=number if isinstance(number, int) else None,
            attempt_ended=bool(attempt.get("end")),
            pinned=max(good) if good else None,
            recorded=frozenset(s for s in recorded if isinstance(s, int)),
        )

    def ended(self, attempt: int) -> bool:
        """True when the operator has moved past `attempt`: it ended, or a later one is current."""
        if self.attempt is None:
            return False
        return self.attempt > attempt or (self.attempt == attempt and self.attempt_ended)


class Reporter(Protocol):
    """Sends one `status.runtime` value; must not raise for transient delivery failures."""

    def report(self, status: contract.RuntimeStatus) -> None:
        """Deliver `status` (the whole `status.runtime` object)."""
        ...

    def operator_view(self) -> OperatorView | None:
        """The operator's view of the run (None: it could not be read now)."""
        ...


class FileReporter:
    """Writes `<root>/<run>/attempts/<attempt>/runtime.json` atomically (tmp, fsync, rename, fsync dir)."""

    def __init__(self, root: str | os.PathLike[str], run: str, attempt: int) -> None:
        self.path = contract.report_file(Path(root) / run, attempt)
        self.status_path = Path(root) / run / "status.json"

    def operator_view(self) -> OperatorView | None:
        """`<root>/<run>/status.json` as the local supervisor writes it; nothing recorded when there is none."""
        try:
            status = json.loads(self.status_path.read_text())
        except FileNotFoundError:
            return OperatorView(attempt=None, attempt_ended=False, pinned=None, supervised=False)  # a bare driver
        except (OSError, ValueError) as e:
            log.warning("cannot read %s: %s", self.status_path, e)
            return None
        return OperatorView.of(status if isinstance(status, dict) else {})

    def report(self, status: contract.RuntimeStatus) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        files.replace_synced(self.path, json.dumps(status, indent=2, sort_keys=True, allow_nan=False).encode())


class KubernetesReporter:
    """JSON merge patch `{"status": {"runtime": ...}}` on trainingruns/<run>/status in the namespace."""

    def __init__(self, run: str, namespace: str, kubeconfig: str | None = None, attempts: int = 3) -> None:
        self.run = run
        self.namespace = namespace
        # Resolved on the driver, so a Ray worker that reports uses the same credentials source.
        self.kubeconfig = kubeconfig if kubeconfig is not None else os.environ.get("KUBECONFIG")
        self.attempts = attempts
        self._api: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_api": None}

    def _client(self) -> Any:
        if self._api is None:
            from kubernetes import client, config

            try:
                config.load_incluster_config()  # type: ignore[no-untyped-call]
                api_client = client.ApiClient()
            except config.ConfigException:
                api_client = config.new_client_from_config(config_file=self.kubeconfig)  # type: ignore[no-untyped-call]
            self._api = client.CustomObjectsApi(api_client)
        return self._api

    def operator_view(self) -> OperatorView | None:
        """GET trainingruns/<run>/status (the driver's Role allows get and patch on it); None if that fails."""
        try:
            obj = self._client().get_namespaced_custom_object_status(GROUP, VERSION, self.namespace, PLURAL, self.run)
        except Exception as e:
            log.warning("reading the status of %s/%s failed: %s", self.namespace, self.run, e)
            return None
        return OperatorView.of((obj or {}).get("status") or {})

    def report(self, status: contract.RuntimeStatus) -> None:
        body = {"status": {contract.REPORT_FIELD: status}}
        for attempt in range(1, self.attempts + 1):
            try:
                self._client().patch_namespaced_custom_object_status(
                    GROUP,
                    VERSION,
                    self.namespace,
                    PLURAL,
                    self.run,
                    body,
                    _content_type="application/merge-patch+json",
                )
                return
            except Exception as e:
                log.warning(
                    "status report %d/%d for %s/%s failed: %s", attempt, self.attempts, self.namespace, self.run, e
                )
                time.sleep(0.2 * attempt)


class ProgressReports:
    """Sends `build()` through `reporter` in order: checkpoints at once, progress at most once per `period_s`.

    One report at a time (an asyncio lock; the report itself runs in a thread); each is built
    when its turn comes, so it carries the newest step and checkpoint. `step_done()` never
    waits: it starts a background sender that reports now if the period has passed, else when
    it passes, and once more after a send if steps finished meanwhile, so the newest step
    reaches the status at most one period (plus one report) late. `checkpoint()` waits for the
    report in flight, then sends. `drain()` lets the sender finish what it started. A report
    that raises is logged and dropped (reporters retry on their own); training goes on.
    `clock` and `sleep` (monotonic seconds, and waiting for some) are injected by tests.
    """

    def __init__(
        self,
        reporter: Reporter,
        build: Callable[[], contract.RuntimeStatus],
        period_s: float = PROGRESS_PERIOD_S,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        if period_s < 0:
            raise ValueError(f"progress period must be >= 0 seconds, got {period_s}")
        self.reporter = reporter
        self.build = build
        self.period_s = period_s
        self._clock = clock
        self._sleep = sleep
        self._lock = asyncio.Lock()
        self._last: float | None = None
        self._dirty = False
        self._sender: asyncio.Task[None] | None = None

    @property
    def sending(self) -> bool:
        """Whether a report is being built or delivered right now."""
        return self._lock.locked()

    def step_done(self) -> None:
        """A step finished: make sure a progress report with it (or a newer step) follows within the period."""
        self._dirty = True
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send_progress(), name="progress-report")

    async def checkpoint(self) -> None:
        """A checkpoint was renamed: report it now, after whatever is in flight."""
        await self._send()

    async def drain(self) -> None:
        """No more progress: wait for the report in flight, if any (before the driver's final report)."""
        self._dirty = False
        sender, self._sender = self._sender, None
        if sender is not None:
            await sender

    async def _send_progress(self) -> None:
        while self._dirty:
            wait = 0.0 if self._last is None else self._last + self.period_s - self._clock()
            if wait > 0:
                await self._sleep(wait)
                if not self._dirty:
                    return  # drained meanwhile (or a checkpoint report carried the step)
            await self._send()

    async def _send(self) -> None:
        async with self._lock:
            self._dirty = False  # what is built now carries every step finished so far
            status = self.build()
            try:
                await asyncio.to_thread(self.reporter.report, status)
            except Exception:
                log.exception("status report at step %s failed", status.get("step"))
                return
            finally:
                self._last = self._clock()


def build(kind: str, *, root: str, run: str, namespace: str, attempt: int) -> Reporter:
    """The reporter named by `--reporter` (`kubernetes` or `file`)."""
    if kind == "kubernetes":
        return KubernetesReporter(run, namespace)
    if kind == "file":
        return FileReporter(root, run, attempt)
    raise ValueError(f"unknown reporter {kind!r} (expected kubernetes or file)")
