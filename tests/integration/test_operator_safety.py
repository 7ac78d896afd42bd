"""Safety properties checked on a real API server: the driver's per-run identity (RBAC), admission of
malformed TrainingRuns (schema and CEL), and an operator killed in the middle of a reconcile."""

from __future__ import annotations

import asyncio
from typing import Any

import kubernetes.client
import pytest
import yaml

from support.operator_double import (
    Cluster,
    InProcessOperator,
    KubeRayDouble,
    eventually,
    tiny_run,
)
from trainingrun_operator.kube import apiclient

pytestmark = pytest.mark.cluster


# ----------------------------------------------------------------------------- per-run identity (RBAC)


def test_the_per_run_identity_can_patch_its_own_status_and_is_denied_on_another_run(
    control_plane: Any, cluster: Cluster, operator: InProcessOperator
) -> None:
    cluster.apply_run(tiny_run("mine"))
    cluster.apply_run(tiny_run("other"))
    eventually(lambda: cluster.rayjob("mine-a1"), what="RayJob mine-a1 (identity created first)")
    token = control_plane.service_account_kubeconfig(cluster.namespace, "mine-driver")

    cluster.report("mine", attempt=1, step=5, kubeconfig=token)
    assert cluster.status("mine")["runtime"]["step"] == 5

    with pytest.raises(kubernetes.client.ApiException) as denied:
        cluster.report("other", attempt=1, step=5, kubeconfig=token)
    assert denied.value.status == 403
    as_driver = kubernetes.client.CustomObjectsApi(control_plane.api_client(token))
    with pytest.raises(kubernetes.client.ApiException) as no_spec:
        as_driver.patch_namespaced_custom_object(
            "trainingrun.dev",
            "v1alpha1",
            cluster.namespace,
            "trainingruns",
            "mine",
            {"spec": {"suspend": True}},
            _content_type="application/merge-patch+json",
        )
    assert no_spec.value.status == 403, "the driver may write its status, not its spec"
    with pytest.raises(kubernetes.client.ApiException) as no_list:
        kubernetes.client.CoreV1Api(control_plane.api_client(token)).list_namespaced_secret(cluster.namespace)
    assert no_list.value.status == 403


# -------------------------------------------------------------------------------------------- admission


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda s: s["checkpoint"].__setitem__("savePeriod", 0), "spec.checkpoint.savePeriod"),
        (lambda s: s["checkpoint"].__setitem__("sav3Period", 5), "spec.checkpoint.sav3Period"),
        (lambda s: s.__setitem__("resume", {"policy": "step"}), "spec.resume"),
        (lambda s: s.__setitem__("resume", {"policy": "step", "step": -3}), "spec.resume.step"),
        (lambda s: s.__setitem__("restartPolicy", {"failureBudget": 0}), "spec.restartPolicy.failureBudget"),
        (
            lambda s: s.__setitem__("restartPolicy", {"backoff": {"initialSeconds": 9, "maxSeconds": 1}}),
            "spec.restartPolicy.backoff",
        ),
        (lambda s: s["checkpoint"].__setitem__("path", "../../etc"), "spec.checkpoint.path"),
        (
            lambda s: s.__setitem__("restartPolicy", {"workerReplacementSeconds": -1}),
            "spec.restartPolicy.workerReplacementSeconds",
        ),
        (
            lambda s: s.__setitem__("restartPolicy", {"nodeNotReadySeconds": -5}),
            "spec.restartPolicy.nodeNotReadySeconds",
        ),
        (lambda s: s["ray"]["head"].__setitem__("shmSize", "8GB"), "spec.ray.head.shmSize"),
        (lambda s: s["ray"]["head"].__setitem__("shmSize", 0), "spec.ray.head.shmSize"),
    ],
    ids=[
        "zero save period",
        "misspelled field",
        "pinned without step",
        "negative step",
        "zero budget",
        "cap below initial",
        "path escapes",
        "negative worker replacement bound",
        "negative NotReady grace",
        "shm size not a quantity",
        "zero shm size",
    ],
)
def test_a_malformed_run_is_rejected_at_admission_naming_the_field(
    control_plane: Any, namespace: str, mutate: Any, field: str
) -> None:
    doc = tiny_run()
    mutate(doc["spec"])
    result = control_plane.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc), check=False)
    assert result.returncode != 0
    assert field in result.stderr, result.stderr


def test_checkpoint_storage_cannot_change_after_creation(control_plane: Any, cluster: Cluster) -> None:
    cluster.apply_run(tiny_run())
    result = control_plane.kubectl(
        "patch",
        "trun",
        "tiny",
        "-n",
        cluster.namespace,
        "--type=merge",
        "-p",
        '{"spec":{"checkpoint":{"pvc":{"claimName":"elsewhere"}}}}',
        check=False,
    )
    assert result.returncode != 0
    assert "immutable" in result.stderr and "spec.checkpoint" in result.stderr


# ---------------------------------------------------------------------------- crash in mid-reconcile


class CrashingApi(apiclient.Api):
    """The real Api, except that the process 'dies' at one chosen point of the first reconcile that gets there.

    Death is simulated by setting the operator's stop flag and never returning from the call, so nothing after
    that point runs (no status write, no event) — as if the process had been killed there.
    """

    def __init__(self, configuration: Any, where: str, stop: Any) -> None:
        super().__init__(configuration)
        self.where, self.stop = where, stop
        self.crashed = False

    async def _die(self) -> None:
        self.crashed = True
        self.stop.set()
        await asyncio.Event().wait()  # cancelled when the operator shuts down

    async def create_rayjob(self, body: Any) -> bool:
        if self.where == "before-create":
            await self._die()
        created = await super().create_rayjob(body)
        if self.where == "after-create":
            await self._die()
        return created


@pytest.mark.parametrize("where", ["before-create", "after-create"])
def test_an_operator_killed_mid_reconcile_restarts_without_duplicates_or_lost_status(
    control_plane: Any, cluster: Cluster, kuberay: KubeRayDouble, namespace: str, where: str
) -> None:
    first = InProcessOperator(control_plane.kubeconfig, namespace)
    first.api = CrashingApi(apiclient.load_configuration(str(control_plane.kubeconfig)), where, first.stop_flag)
    first.start()
    cluster.apply_run(tiny_run())
    eventually(lambda: first.api.crashed, what="the crash point")  # type: ignore[attr-defined]
    first.stop()
    status = cluster.status("tiny")
    assert status["attempt"]["rayJobName"] == "tiny-a1", "the identity was written before the crash"
    assert (cluster.rayjob("tiny-a1") is not None) == (where == "after-create")

    second = InProcessOperator(control_plane.kubeconfig, namespace).start()
    try:
        eventually(lambda: cluster.rayjob("tiny-a1"), what="RayJob tiny-a1 after the restart")
        kuberay.start("tiny-a1")
        eventually(lambda: cluster.status("tiny").get("phase") == "Running", what="phase Running")
        assert [j["metadata"]["name"] for j in cluster.rayjobs()] == ["tiny-a1"]
        after = cluster.status("tiny")
        assert after["attempt"]["number"] == 1 and after["attempt"]["start"] == status["attempt"]["start"]
        assert after["startTime"] == status["startTime"]
        if where == "before-create":
            cluster.events_with("tiny", "CreatedRayJob")
        else:
            assert "CreatedRayJob" not in cluster.events("tiny")
    finally:
        second.stop()


def test_creating_an_existing_rayjob_adopts_it_instead_of_failing(control_plane: Any, cluster: Cluster) -> None:
    from trainingrun_operator.core import model, rayjob

    created = cluster.apply_run(tiny_run())
    spec = model.TrainingRunSpec.model_validate(created["spec"])
    body = rayjob.build_rayjob("tiny", cluster.namespace, created["metadata"]["uid"], 1, None, spec)
    api = apiclient.Api(apiclient.load_configuration(str(control_plane.kubeconfig)))
    try:
        assert asyncio.run(api.create_rayjob(body)) is True
        assert asyncio.run(api.create_rayjob(body)) is False
    finally:
        api.close()
    assert [j["metadata"]["name"] for j in cluster.rayjobs()] == ["tiny-a1"]
