"""The KubeRay test double (`support.operator_double`) does what KubeRay 1.5 does to the objects the operator
watches."""

from __future__ import annotations

import pytest

from support.operator_double import Cluster, InProcessOperator, KubeRayDouble, tiny_run

pytestmark = pytest.mark.cluster


# ------------------------------------------------------------------- the double behaves like KubeRay


def test_double_creates_head_pods_from_the_template_with_kuberays_labels_and_owner(
    cluster: Cluster, kuberay: KubeRayDouble, operator: InProcessOperator
) -> None:
    cluster.apply_run(tiny_run())
    kuberay.start("tiny-a1")
    (head,) = cluster.pods("ray.io/node-type=head")
    assert head.metadata.labels["trainingrun.dev/run"] == "tiny"
    assert head.metadata.labels["ray.io/cluster"] == "tiny-a1-raycluster"
    assert head.metadata.owner_references[0].kind == "RayJob"
    assert head.spec.service_account_name == "tiny-driver"
    assert cluster.rayjob("tiny-a1")["status"]["jobDeploymentStatus"] == "Running"
