"""Reporters: how the driver tells the world about progress and completed checkpoints.

    controller: checkpoint renamed to step_N ─► report(status) ─► KubernetesReporter: merge patch status.runtime
                                                                └► FileReporter: <root>/<run>/attempts/<N>/runtime.json

The driver writes only `status.runtime` (one writer per field; the operator owns the
rest of the status) and only after a checkpoint's rename, so a reported checkpoint
always exists. Shape (camelCase, as in the CRD):

    runtime: {attempt, step, reward, updated, lastCheckpoint: {step, path, attempt, replayDigest,
              weightsSha256, time} | null, restoreError, finished}

The Kubernetes reporter authenticates as the pod's service account (in-cluster
config) and falls back to `KUBECONFIG` (the test bed). A failed report is logged
and retried on the next one; it never stops training. Imports `kubernetes` lazily,
so the file reporter works without it.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Protocol, TypedDict

__all__ = [
    "CheckpointReport",
    "FileReporter",
    "KubernetesReporter",
    "Reporter",
    "RuntimeStatus",
    "build",
    "rfc3339_now",
]

log = logging.getLogger(__name__)

GROUP = "trainingrun.dev"
VERSION = "v1alpha1"
PLURAL = "trainingruns"


class CheckpointReport(TypedDict):
    """`status.runtime.lastCheckpoint`: a completed (renamed) checkpoint."""

    step: int
    path: str
    attempt: int
    replayDigest: str
    weightsSha256: str | None
    time: str


class RuntimeStatus(TypedDict):
    """`status.runtime`: the driver's view of the attempt."""

    attempt: int
    step: int
    reward: float | None
    updated: str
    lastCheckpoint: CheckpointReport | None
    restoreError: str | None
    finished: bool


class Reporter(Protocol):
    """Sends one `status.runtime` value; must not raise for transient delivery failures."""

    def report(self, status: RuntimeStatus) -> None:
        """Deliver `status` (the whole `status.runtime` object)."""
        ...


def rfc3339_now() -> str:
    """The current UTC time as RFC 3339 with milliseconds and a Z."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return now.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class FileReporter:
    """Writes `<root>/<run>/attempts/<attempt>/runtime.json` atomically (tmp, fsync, rename, fsync dir)."""

    def __init__(self, root: str | os.PathLike[str], run: str, attempt: int) -> None:
        self.path = Path(root) / run / "attempts" / str(attempt) / "runtime.json"

    def report(self, status: RuntimeStatus) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        with open(tmp, "w") as f:
            json.dump(status, f, indent=2, sort_keys=True, allow_nan=False)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, self.path)
        fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


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

    def report(self, status: RuntimeStatus) -> None:
        body = {"status": {"runtime": status}}
        for attempt in range(1, self.attempts + 1):
            try:
                self._client().patch_namespaced_custom_object_status(
                    GROUP, VERSION, self.namespace, PLURAL, self.run, body,
                    _content_type="application/merge-patch+json",
                )
                return
            except Exception as e:  # noqa: BLE001 - a report must never stop training
                log.warning("status report %d/%d for %s/%s failed: %s", attempt, self.attempts, self.namespace,
                            self.run, e)
                time.sleep(0.2 * attempt)


def build(kind: str, *, root: str, run: str, namespace: str, attempt: int) -> Reporter:
    """The reporter named by `--reporter` (`kubernetes` or `file`)."""
    if kind == "kubernetes":
        return KubernetesReporter(run, namespace)
    if kind == "file":
        return FileReporter(root, run, attempt)
    raise ValueError(f"unknown reporter {kind!r} (expected kubernetes or file)")
