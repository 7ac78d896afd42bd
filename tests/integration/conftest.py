"""Fixtures of the integration tests: the operator's cluster-test harness (`support.operator_double`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from support.operator_double import Cluster, InProcessOperator, KubeRayDouble


@pytest.fixture
def cluster(control_plane: Any, namespace: str) -> Cluster:
    return Cluster(control_plane, namespace)


@pytest.fixture
def kuberay(cluster: Cluster) -> KubeRayDouble:
    return KubeRayDouble(cluster)


@pytest.fixture
def operator(control_plane: Any, namespace: str) -> Iterator[InProcessOperator]:
    running = InProcessOperator(control_plane.kubeconfig, namespace).start()
    try:
        yield running
    finally:
        running.stop()
