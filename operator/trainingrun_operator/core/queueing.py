"""Queueing with Kueue: which queue a TrainingRun's attempts wait in, and Kueue's rules for a RayJob. Pure.

Who calls it: `reconciler.py` reads the run's queue from its labels (`queue_of`) for the decision; `decision.py`
fails a queued run whose spec breaks Kueue's rules (`problem`) and creates a queued attempt's RayJob suspended;
`rayjob.py` copies the labels onto the RayJob (`rayjob_labels`).

    TrainingRun (labels: kueue.x-k8s.io/queue-name, kueue.x-k8s.io/priority-class)
      └── RayJob <run>-a<N>  same two labels, spec.suspend: true   (what Kueue's RayJob webhook would do)
            Kueue: Workload from the RayJob's pod sets -> quota in the LocalQueue's ClusterQueue -> admitted:
            spec.suspend: false (KubeRay starts the cluster)   ...   evicted/preempted: spec.suspend: true again

Kueue's rules for a RayJob it manages (its RayJob webhook, sigs.k8s.io/kueue v0.17.0): `shutdownAfterJobFinishes`
true, no `clusterSelector` (an existing cluster), a `rayClusterSpec`, no in-tree autoscaling, at most 8 pod sets
(the head and 7 worker groups; HTTPMode adds no submitter pod set), no worker group named `head`, and a queue name
that is a valid object name. The operator's RayJob always has the first four (`rayjob.build_rayjob`); the others
depend on the TrainingRun, so `problem` checks them. The CRD's CEL rules cannot see them: a CRD's validation rules
see only `metadata.name` and `metadata.generateName` of the metadata, so no rule can tell a queued run from another.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from trainingrun_operator.core import model

__all__ = [
    "MAX_WORKER_GROUPS",
    "PRIORITY_CLASS_LABEL",
    "QUEUE_LABEL",
    "RESERVED_GROUP",
    "Queue",
    "problem",
    "queue_of",
    "rayjob_labels",
]

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
"""The LocalQueue (in the run's namespace) whose ClusterQueue's quota each attempt waits for."""
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
"""A Kueue WorkloadPriorityClass: the order within the queue, and who may preempt whom."""
MAX_WORKER_GROUPS = 7
"""Kueue's Workload holds at most 8 pod sets: the head's and one per worker group."""
RESERVED_GROUP = "head"
"""Kueue names the head's pod set `head`: no worker group may have that name."""
_OBJECT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclasses.dataclass(frozen=True)
class Queue:
    """Where a run's attempts wait for admission: the LocalQueue, and the priority class if one is named."""

    name: str
    priority_class: str | None = None


def queue_of(labels: Mapping[str, str] | None) -> Queue | None:
    """The run's queue from its labels; None when it names none (its attempts start at once)."""
    labels = labels or {}
    name = labels.get(QUEUE_LABEL)
    if not name:
        return None  # Kueue too: an empty queue name is no queue
    return Queue(name=name, priority_class=labels.get(PRIORITY_CLASS_LABEL) or None)


def rayjob_labels(queue: Queue | None) -> dict[str, str]:
    """The labels that put an attempt's RayJob into the queue (none for a run without one)."""
    if queue is None:
        return {}
    labels = {QUEUE_LABEL: queue.name}
    if queue.priority_class:
        labels[PRIORITY_CLASS_LABEL] = queue.priority_class
    return labels


def problem(spec: model.TrainingRunSpec, queue: Queue | None) -> str | None:
    """Why Kueue would refuse this run's RayJobs ('<field>: <what>', naming the label), or None."""
    if queue is None:
        return None
    if not _OBJECT_NAME.match(queue.name) or len(queue.name) > 253:
        return (
            f"metadata.labels[{QUEUE_LABEL}]: {queue.name!r} is not a LocalQueue name (lowercase letters, digits, "
            "'-' and '.')"
        )
    if queue.priority_class is not None and not _OBJECT_NAME.match(queue.priority_class):
        return (
            f"metadata.labels[{PRIORITY_CLASS_LABEL}]: {queue.priority_class!r} is not a WorkloadPriorityClass name "
            "(lowercase letters, digits, '-' and '.')"
        )
    groups = spec.ray.workers or []
    if len(groups) > MAX_WORKER_GROUPS:
        return (
            f"spec.ray.workers: {len(groups)} worker groups, but a run queued by Kueue ({QUEUE_LABEL}) may have at "
            f"most {MAX_WORKER_GROUPS} (Kueue admits at most 8 pod sets: the head and one per worker group); merge "
            "groups, or remove the label"
        )
    for i, group in enumerate(groups):
        if group.name == RESERVED_GROUP:
            return (
                f"spec.ray.workers[{i}].name: {RESERVED_GROUP!r} is the name of the head's pod set in Kueue; a run "
                f"queued by Kueue ({QUEUE_LABEL}) needs another name for this worker group"
            )
    return None
