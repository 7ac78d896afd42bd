"""Which Service reaches which Ray container port (hack/testbed/podrunner.py `selects`, `service_targets`): what the
pod runner turns into proxy routes and a container pod's host names. Pure: dicts in, a dict out."""

from __future__ import annotations

from typing import Any

import podrunner

HEAD = {
    "metadata": {
        "name": "rc-head-x",
        "namespace": "ns",
        "labels": {"ray.io/cluster": "rc", "ray.io/node-type": "head"},
    },
    "spec": {"containers": [{"name": "ray-head", "ports": [{"name": "dashboard", "containerPort": 8265}]}]},
}


def service(selector: dict[str, str], ports: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"name": "rc-head-svc", "namespace": "ns"}, "spec": {"selector": selector, "ports": ports}}


def test_a_service_that_selects_the_head_reaches_its_ports_by_number_or_by_name() -> None:
    svc = service(
        {"ray.io/cluster": "rc", "ray.io/node-type": "head"},
        [{"port": 8265, "targetPort": "dashboard"}, {"port": 6379}, {"port": 10001, "targetPort": "nope"}],
    )
    assert podrunner.service_targets(svc, HEAD) == {
        "rc-head-svc.ns.svc.cluster.local:8265": 8265,
        "rc-head-svc.ns.svc.cluster.local:6379": 6379,
    }


def test_a_service_without_a_selector_or_for_another_cluster_reaches_nothing() -> None:
    assert not podrunner.selects(service({}, [{"port": 80}]), HEAD)
    assert podrunner.service_targets(service({"ray.io/cluster": "other"}, [{"port": 80}]), HEAD) == {}
