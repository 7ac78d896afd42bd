"""The test bed's fake nodes (hack/testbed/fakenodes.py): the Node object kwok plays, when a node can take pods,
and what a pod needs to land on a lone node. Pure: dicts in, dicts out; no kwok, no cluster."""

from __future__ import annotations

from typing import Any

import pytest

import fakenodes


def node(ready: str | None, *taint_keys: str) -> dict[str, Any]:
    conditions = [] if ready is None else [{"type": "Ready", "status": ready}]
    return {
        "spec": {"taints": [{"key": k, "effect": "NoSchedule"} for k in taint_keys]},
        "status": {"conditions": conditions},
    }


def test_a_fake_node_is_annotated_for_the_shared_kwok_and_carries_its_capacity() -> None:
    made = fakenodes.fake_node("n1", cpu="4", labels={"pool": "a"}, taints=[fakenodes.LoneNode.taint("n1")])
    assert made["metadata"]["annotations"][fakenodes.KWOK_ANNOTATION] == "fake"
    assert made["metadata"]["labels"]["kubernetes.io/hostname"] == "n1"
    assert made["metadata"]["labels"]["pool"] == "a"
    assert made["status"]["capacity"] == made["status"]["allocatable"] == {"cpu": "4", "memory": "256Gi", "pods": "110"}
    assert made["spec"]["taints"] == [{"key": fakenodes.LONE_NODE_TAINT, "value": "n1", "effect": "NoSchedule"}]


def test_an_annotation_given_replaces_the_shared_kwoks() -> None:
    made = fakenodes.fake_node("n1", annotations={fakenodes.KWOK_ANNOTATION: "n1"})
    assert made["metadata"]["annotations"][fakenodes.KWOK_ANNOTATION] == "n1"


@pytest.mark.parametrize(
    ("obj", "schedulable"),
    [
        (node("True"), True),
        (node("True", fakenodes.LONE_NODE_TAINT), True),  # only the pods that ask for it, but it can take pods
        (node("True", "node.kubernetes.io/not-ready"), False),
        (node("True", "node.kubernetes.io/unreachable"), False),
        (node("False"), False),
        (node("Unknown"), False),
        (node(None), False),
    ],
)
def test_a_node_is_schedulable_when_ready_and_without_a_node_lifecycle_taint(
    obj: dict[str, Any], schedulable: bool
) -> None:
    assert fakenodes.node_is_schedulable(obj) is schedulable


def test_no_node_is_not_ready() -> None:
    assert not fakenodes.node_ready(None)


def test_a_pod_with_the_lone_nodes_fields_selects_it_and_tolerates_its_taint() -> None:
    fields = fakenodes.LoneNode("doomed-1", kubelet=None).pod_fields()  # type: ignore[arg-type]
    assert fields["nodeSelector"] == {"kubernetes.io/hostname": "doomed-1"}
    (toleration,) = fields["tolerations"]
    taint = fakenodes.LoneNode.taint("doomed-1")
    assert toleration == {**taint, "operator": "Equal"}


def test_the_bed_plays_the_kubelet_only_of_a_ready_kwok_node() -> None:
    played = fakenodes.fake_node("n1")
    played["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    assert fakenodes.kubelet_up(played)
    assert not fakenodes.kubelet_up({**played, "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}})
    assert not fakenodes.kubelet_up({**played, "metadata": {"name": "real", "annotations": {}}})
    assert not fakenodes.kubelet_up(None)
