"""What `kubectl get trun` and `kubectl describe trun` show, with the real kubectl against a real API server, the
operator in-process and KubeRay played by the double (see test_operator_double.py)."""

from __future__ import annotations

import datetime
import re
from typing import Any

import pytest

from support.operator_double import Cluster, InProcessOperator, KubeRayDouble, eventually, phase_is, tiny_run
from trainingrun_runtime import timestamps

pytestmark = pytest.mark.cluster


def before(base: datetime.datetime, seconds: float) -> str:
    return timestamps.rfc3339(base - datetime.timedelta(seconds=seconds))


def progress_report(cluster: Cluster, step: int, reward: float, updated: str) -> None:
    """What the driver sends after a step (no new checkpoint): step, reward and time only (merge patch)."""
    runtime = {"step": step, "reward": reward, "updated": updated}
    cluster.custom.patch_namespaced_custom_object_status(
        "trainingrun.dev",
        "v1alpha1",
        cluster.namespace,
        "trainingruns",
        "tiny",
        {"status": {"runtime": runtime}},
        _content_type="application/merge-patch+json",
    )


def table(control_plane: Any, namespace: str, *args: str) -> dict[str, str]:
    """`kubectl get trun tiny` as {COLUMN: value}, cut at the header's offsets (a missing value is blank)."""
    header, row = control_plane.kubectl("get", "trun", "tiny", "-n", namespace, *args).stdout.splitlines()
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    ends = [*starts[1:], None]
    return {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, ends, strict=True)}


def test_get_shows_progress_and_wide_adds_reward_goodput_and_eta_from_the_drivers_reports(
    control_plane: Any, cluster: Cluster, kuberay: KubeRayDouble, operator: InProcessOperator
) -> None:
    cluster.apply_run(tiny_run())
    kuberay.start("tiny-a1")
    eventually(lambda: phase_is(cluster, "tiny", "Running"), what="phase Running")
    assert table(control_plane, cluster.namespace)["PROGRESS"] == "0/120"

    now = datetime.datetime.now(datetime.UTC)
    cluster.report("tiny", attempt=1, step=10, updated=before(now, 60))  # a checkpoint's report wakes the operator
    eventually(lambda: cluster.status("tiny").get("progress") == "10/120", what="progress 10/120")
    # A report of progress alone, 35 s newer (driver's clock) than the one the operator read: a pass, which
    # measures the rate over those 35 s.
    progress_report(cluster, 25, 0.45678, before(now, 25))
    eventually(lambda: cluster.status("tiny").get("progress") == "25/120", what="progress 25/120")

    shown = table(control_plane, cluster.namespace)
    assert list(shown) == ["NAME", "PHASE", "PROGRESS", "STEP", "ATTEMPT", "RESTARTS", "AGE"]
    assert (shown["PHASE"], shown["PROGRESS"], shown["STEP"]) == ("Running", "25/120", "10")
    wide = table(control_plane, cluster.namespace, "-o", "wide")
    assert (wide["REWARD"], wide["ETA"]) == ("0.457", "4m")  # 15 steps in 35 s; 95 left: 222 s

    cluster.report("tiny", attempt=1, step=30, updated=timestamps.now())  # now, by the operator's clock too
    eventually(lambda: (cluster.status("tiny").get("goodput") or {}).get("ratio") is not None, what="goodput")
    ratio = cluster.status("tiny")["goodput"]["ratio"]
    assert table(control_plane, cluster.namespace, "-o", "wide")["GOODPUT"] == f"{ratio:g}" and 0 < ratio <= 1


def test_describe_shows_the_attempt_history_as_an_aligned_table(
    control_plane: Any, cluster: Cluster, kuberay: KubeRayDouble, operator: InProcessOperator
) -> None:
    cluster.apply_run(tiny_run())
    kuberay.start("tiny-a1")
    eventually(lambda: phase_is(cluster, "tiny", "Running"), what="phase Running")
    cluster.report("tiny", attempt=1, step=10, updated=timestamps.now())
    eventually(lambda: (cluster.status("tiny").get("checkpoints") or {}).get("latest"), what="checkpoint recorded")
    kuberay.preempt_head("tiny-a1")
    eventually(lambda: cluster.rayjob("tiny-a2"), what="RayJob tiny-a2")
    eventually(lambda: len(cluster.status("tiny").get("attemptTable") or []) == 3, what="attempt 2 in the table")

    described = control_plane.kubectl("describe", "trun", "tiny", "-n", cluster.namespace).stdout.splitlines()
    start = next(i for i, line in enumerate(described) if line.strip() == "Attempt Table:")
    header, first, second = described[start + 1 : start + 4]
    assert header.split() == [
        "ATTEMPT", "STARTED", "RAN", "RESUMED-FROM", "ENDED-AS", "STEPS-LOST", "WORKERS-LOST", "LOST"
    ]  # fmt: skip
    assert first.split()[0] == "1" and first.split()[3:6] == ["fresh", "Preempted", "0"]
    assert len(first.split()) == 8, "an ended attempt's lost seconds: its start at least, or - under a second"
    assert second.split()[0] == "2" and second.split()[2:5] == ["running", "10", "-"] and second.split()[-1] == "-"
    for column in ("STARTED", "RAN", "RESUMED-FROM", "ENDED-AS"):
        offset = header.index(column)
        assert first[offset - 2 : offset] == "  " and first[offset] != " ", f"{column} misaligned:\n{header}\n{first}"
        assert second[offset - 2 : offset] == "  " and second[offset] != " ", (
            f"{column} misaligned:\n{header}\n{second}"
        )
