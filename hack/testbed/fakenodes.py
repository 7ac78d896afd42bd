"""The test bed's fake nodes: the Node objects kwok plays (`fake_node`), a node whose kubelet can die
(`LoneNode`), when a node can take pods, and how quickly a dead one is noticed.

Who uses it: `controlplane.ControlPlane` (creates the nodes, starts their kwok, waits until they can take pods),
`podrunner` (plays only pods on Ready kwok nodes), `fullloop` (the Ray pods' own node) and the tests (a node that
dies). Pure: building and reading Node dicts; the API calls are ControlPlane's.

A node's life, as kwok and the controller manager play it:
    created (annotated KWOK_ANNOTATION) ──> its kwok marks it Ready and renews its Lease every lease/4
      ──> its kwok stops ──> NODE_MONITOR_GRACE after the last renewal the node lifecycle controller calls it
          Unknown (and taints it node.kubernetes.io/unreachable); its pods go not Ready
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import components
import kubeapi

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
LONE_NODE_TAINT = "trainingrun.dev/testbed"
# Node heartbeats: kwok renews each node's Lease every lease/4 = 5 s; the node lifecycle controller calls a node
# Unknown (NotReady) 30 s after the last renewal. Six missed renewals on a busy 2-core machine before a flap.
KWOK_NODE_LEASE_SECONDS = 20
NODE_MONITOR_GRACE = "30s"


def fake_node(
    name: str,
    *,
    cpu: str = "32",
    memory: str = "256Gi",
    pods: str = "110",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    taints: Sequence[dict[str, str]] = (),
) -> dict[str, Any]:
    """A Node object for kwok to play, with capacity and allocatable in its status (kept on create)."""
    resources = {"cpu": cpu, "memory": memory, "pods": pods}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0", **(annotations or {})},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                **(labels or {}),
            },
        },
        "spec": {"taints": list(taints)},
        "status": {"capacity": resources, "allocatable": resources},
    }


def node_ready(node: dict[str, Any] | None) -> bool:
    return (kubeapi.condition(node, "Ready") or {}).get("status") == "True"


def kubelet_up(node: dict[str, Any] | None) -> bool:
    """Whether the bed plays the kubelet of `node` now: a kwok node (annotated KWOK_ANNOTATION) that is Ready."""
    if node is None or KWOK_ANNOTATION not in (node["metadata"].get("annotations") or {}):
        return False
    return node_ready(node)


def node_is_schedulable(node: dict[str, Any]) -> bool:
    """Ready and without a `node.kubernetes.io/*` taint (not-ready, unreachable, ...), so pods can land."""
    taints = node.get("spec", {}).get("taints") or []
    return node_ready(node) and not any(t.get("key", "").startswith("node.kubernetes.io/") for t in taints)


@dataclass(frozen=True)
class LoneNode:
    """A fake node played by a kwok of its own (its kubelet: stopping it is the node dying), tainted so that only
    the pods that ask for it (`pod_fields`) land there."""

    name: str
    kubelet: components.Process

    @staticmethod
    def taint(name: str) -> dict[str, str]:
        return {"key": LONE_NODE_TAINT, "value": name, "effect": "NoSchedule"}

    def pod_fields(self) -> dict[str, Any]:
        """The nodeSelector and tolerations of a pod spec that lands on this node."""
        return {
            "nodeSelector": {"kubernetes.io/hostname": self.name},
            "tolerations": [{**LoneNode.taint(self.name), "operator": "Equal"}],
        }
