"""The Kubernetes reporter against a real kube-apiserver with our CRD: it writes status.runtime only.

It authenticates from KUBECONFIG (no in-cluster config here, as in the test bed), sends a JSON merge patch to
trainingruns/<run>/status, and leaves every other status field alone. With a token whose Role allows patching
only this run's status, the report lands; a report for another run is refused by the API server, logged, and
does not raise (a report never stops training).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from trainingrun_runtime import contract, timestamps
from trainingrun_runtime.sdk import reporting

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]


def _status(step: int) -> contract.RuntimeStatus:
    return contract.RuntimeStatus(
        attempt=2,
        step=step,
        reward=0.75,
        updated=timestamps.now(),
        lastCheckpoint=contract.CheckpointReport(
            step=step,
            path=f"/ckpt/tiny/step_{step}",
            attempt=2,
            replayDigest="ab" * 32,
            weightsSha256="cd" * 32,
            time=timestamps.now(),
        ),
        restoreError=None,
        finished=False,
        badCheckpoints=[],
    )


def _get(control_plane: Any, namespace: str, name: str) -> dict[str, Any]:
    out = control_plane.kubectl("get", "trainingrun", name, "-n", namespace, "-o", "json").stdout
    return dict(json.loads(out))


def test_a_report_patches_only_status_runtime_of_its_own_run(
    control_plane: Any, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    example = (REPO / "manifests" / "examples" / "tiny.yaml").read_text()
    control_plane.kubectl("apply", "-n", namespace, "-f", "-", input=example)
    control_plane.kubectl("apply", "-n", namespace, "-f", "-", input=example.replace("name: tiny", "name: other"))
    # The operator's own status field, which the driver must never overwrite.
    control_plane.kubectl(
        "patch",
        "trainingrun",
        "tiny",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"phase": "Running"}}),
    )

    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "tiny-driver", "namespace": namespace},
        "rules": [
            {
                "apiGroups": ["trainingrun.dev"],
                "resources": ["trainingruns/status"],
                "resourceNames": ["tiny"],
                "verbs": ["get", "patch"],
            }
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "tiny-driver", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tiny-driver"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": namespace}],
    }
    control_plane.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [role, binding]})
    )
    kubeconfig = control_plane.service_account_kubeconfig(namespace, "default")

    reporting.KubernetesReporter("tiny", namespace, kubeconfig=str(kubeconfig)).report(_status(10))
    reporting.KubernetesReporter("tiny", namespace, kubeconfig=str(kubeconfig)).report(_status(20))
    status = _get(control_plane, namespace, "tiny")["status"]
    assert status["phase"] == "Running"
    assert status["runtime"]["step"] == 20
    assert status["runtime"]["lastCheckpoint"]["path"] == "/ckpt/tiny/step_20"
    assert status["runtime"].get("restoreError") is None  # a null in a merge patch removes the key

    with caplog.at_level(logging.WARNING, logger="trainingrun_runtime.sdk.reporting"):
        reporting.KubernetesReporter("other", namespace, kubeconfig=str(kubeconfig), attempts=1).report(_status(30))
    assert "Forbidden" in caplog.text or "403" in caplog.text
    assert "runtime" not in _get(control_plane, namespace, "other").get("status", {})


def test_without_in_cluster_config_the_reporter_uses_kubeconfig_from_the_environment(
    control_plane: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    example = (REPO / "manifests" / "examples" / "tiny.yaml").read_text()
    control_plane.kubectl("apply", "-n", namespace, "-f", "-", input=example)
    monkeypatch.setenv("KUBECONFIG", str(control_plane.kubeconfig))
    rep = reporting.build("kubernetes", root="/unused", run="tiny", namespace=namespace, attempt=2)
    rep.report(_status(40))
    assert _get(control_plane, namespace, "tiny")["status"]["runtime"]["step"] == 40
