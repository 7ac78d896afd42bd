"""The cluster admin's allow-list (the chart's podSecurity.allow) on a real API server: the chart's
ValidatingAdmissionPolicy, the lists written into its expressions, refuses at `create` a pod template that adds a
capability or has a hostPath volume the list lacks, naming the field in the operator's words (`allowance.py`).

- with the chart's default values (nothing allowed), a run whose worker adds IPC_LOCK is refused naming the field;
  the same run without it is admitted, and so is a metadata-only update of a run stored before the policy;
- rendered with IPC_LOCK allowed, such a run is admitted while SYS_ADMIN (in another worker group's init
  container, or on the head) is still refused, naming that group and container;
- with /dev/infiniband allowed, a hostPath at or under it is admitted; `/`, /dev/infinibandX and a `..` escape are
  refused.

The chart is rendered with helm, its release in a namespace of its own, and its policy and binding applied, the
binding narrowed to the namespaces this module labels (other tests create such runs on purpose, to see the
operator refuse them). Each test labels its namespace and applies the policy rendered again with the values it
needs, as `helm upgrade` would. Requests are server-side dry runs unless a run must be stored.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import yaml

from support.chart import render
from support.operator_double import eventually, tiny_run
from trainingrun_operator.core import allowance

pytestmark = pytest.mark.cluster

WORDS = {a.values: a for a in allowance.ALLOWABLE}
SELECTED = "trainingrun.dev/pod-security-test"
"""The label of the namespaces the module's binding selects."""


class Release:
    """The chart's pod security objects, rendered for a release in a namespace of its own and applied."""

    def __init__(self, plane: Any) -> None:
        self.plane = plane
        self.id = uuid.uuid4().hex[:5]
        self.namespace, self.release = f"t-pod-security-{self.id}", f"ps-{self.id}"
        self.name = f"{self.release}-trainingrun-pod-security"

    def objects(self, capabilities: Sequence[str] = (), host_paths: Sequence[str] = ()) -> dict[str, dict[str, Any]]:
        sets = ["--set-json", f"podSecurity.allow.capabilities={json.dumps(list(capabilities))}"]
        sets += ["--set-json", f"podSecurity.allow.hostPaths={json.dumps(list(host_paths))}"]
        docs = [d for d in yaml.safe_load_all(render(self.plane, self.release, self.namespace, *sets)) if d]
        return {d["kind"]: d for d in docs if d["metadata"]["name"] == self.name}

    def install(self) -> None:
        """The chart's default values: the policy, and the binding narrowed to SELECTED."""
        self.plane.create_namespace(self.namespace)
        found = self.objects()
        binding = found["ValidatingAdmissionPolicyBinding"]
        binding["spec"]["matchResources"] = {"namespaceSelector": {"matchLabels": {SELECTED: self.id}}}
        self.plane.apply(found["ValidatingAdmissionPolicy"], binding)

    def allow(self, capabilities: Sequence[str] = (), host_paths: Sequence[str] = ()) -> None:
        """What `helm upgrade` with these values does to the admission side: the policy rendered again."""
        self.plane.apply(self.objects(capabilities, host_paths)["ValidatingAdmissionPolicy"])

    def uninstall(self) -> None:
        for kind in ("validatingadmissionpolicybinding", "validatingadmissionpolicy"):
            self.plane.kubectl("delete", kind, self.name, "--ignore-not-found", check=False)
        self.plane.kubectl("delete", "namespace", self.namespace, "--wait=false", check=False)


class Runs:
    """TrainingRuns created in the test's namespace, under the module's policy."""

    def __init__(self, release: Release, namespace: str) -> None:
        self.release, self.plane, self.namespace = release, release.plane, namespace
        self.path = f"/apis/trainingrun.dev/v1alpha1/namespaces/{namespace}/trainingruns"

    def create(self, doc: dict[str, Any], dry_run: bool = True) -> tuple[int, Any]:
        answer: tuple[int, Any] = self.plane.request("POST", self.path + ("?dryRun=All" if dry_run else ""), doc)
        return answer

    def refused_saying(self, doc: dict[str, Any], words: str) -> tuple[int, Any] | None:
        got = self.create(doc)
        return got if got[0] >= 400 and words in str(got[1].get("message")) else None

    def admitted(self, doc: dict[str, Any]) -> tuple[int, Any] | None:
        got = self.create(doc)
        return got if got[0] == 201 else None


@pytest.fixture(scope="module")
def release(control_plane: Any) -> Iterator[Release]:
    installed = Release(control_plane)
    installed.install()
    try:
        yield installed
    finally:
        installed.uninstall()


def select(release: Release, namespace: str) -> Runs:
    """`namespace` selected by the binding, the allow-list back to the chart's default (empty), and both in force:
    a run adding IPC_LOCK refused in the allow-list's words."""
    release.plane.kubectl("label", "namespace", namespace, f"{SELECTED}={release.id}", "--overwrite")
    release.allow()
    runs = Runs(release, namespace)
    eventually(
        lambda: runs.refused_saying(adding("probe", "IPC_LOCK"), WORDS["capabilities"].message("IPC_LOCK")),
        what="the policy, its empty allow-list and the namespace's label in force (the API server loads them shortly"
        " after they change)",
    )
    return runs


@pytest.fixture
def runs(release: Release, namespace: str) -> Runs:
    return select(release, namespace)


def container(name: str, *capabilities: str, **fields: Any) -> dict[str, Any]:
    context = {"capabilities": {"drop": ["ALL"], "add": list(capabilities)}}
    return {"name": name, **fields, "securityContext": context}


def with_workers(name: str, *templates: dict[str, Any]) -> dict[str, Any]:
    """The tiny example with one worker group per template (g0, g1, ...)."""
    return tiny_run(
        name,
        ray={"head": {}, "workers": [{"name": f"g{i}", "replicas": 1, "template": t} for i, t in enumerate(templates)]},
    )


def adding(name: str, *capabilities: str) -> dict[str, Any]:
    return with_workers(name, {"spec": {"containers": [container("ray-worker", *capabilities)]}})


def mounting(name: str, path: str) -> dict[str, Any]:
    volume = {"name": "devices", "hostPath": {"path": path, "type": "Directory"}}
    mount = {"name": "devices", "mountPath": "/devices"}
    return with_workers(
        name, {"spec": {"volumes": [volume], "containers": [container("ray-worker", volumeMounts=[mount])]}}
    )


CAPABILITIES = "spec.ray.workers[0].template.spec.containers[0].securityContext.capabilities.add"
MERGE = "application/merge-patch+json"


def test_with_the_charts_default_values_a_run_adding_ipc_lock_is_refused_at_create_naming_the_field(
    release: Release, namespace: str
) -> None:
    # Stored before the policy selects the namespace (the CRD no longer refuses it): the policy must leave its
    # metadata alone.
    early = Runs(release, namespace)
    assert early.create(adding("before", "IPC_LOCK"), dry_run=False)[0] == 201
    runs = select(release, namespace)
    status, body = runs.create(adding("rdma", "IPC_LOCK"))
    assert status == 422, body
    assert f"{CAPABILITIES}: {WORDS['capabilities'].message('IPC_LOCK')}" in body["message"], body["message"]
    assert runs.create(adding("plain"))[0] == 201, "a run that adds nothing is admitted"

    finalizer = {"metadata": {"finalizers": ["trainingrun.dev/finalizer"]}}
    assert runs.plane.request("PATCH", f"{runs.path}/before", finalizer, content_type=MERGE)[0] == 200
    status, body = runs.plane.request("PATCH", f"{runs.path}/before", {"spec": {"suspend": True}}, content_type=MERGE)
    assert status == 422 and CAPABILITIES in body["message"], "an update of the spec is checked"
    runs.plane.request("PATCH", f"{runs.path}/before", {"metadata": {"finalizers": None}}, content_type=MERGE)


def test_with_ipc_lock_in_the_allow_list_a_run_adding_it_is_admitted_while_sys_admin_is_still_refused(
    release: Release, runs: Runs
) -> None:
    release.allow(capabilities=["IPC_LOCK"])
    eventually(lambda: runs.admitted(adding("rdma", "IPC_LOCK")), what="IPC_LOCK allowed by the policy rendered again")

    init = container("setup", "IPC_LOCK", "SYS_ADMIN", image="busybox:1.36")
    doc = with_workers(
        "mixed",
        {"spec": {"containers": [container("ray-worker", "IPC_LOCK")]}},
        {"spec": {"initContainers": [init]}},
    )
    status, body = runs.create(doc)
    field = "spec.ray.workers[1].template.spec.initContainers[0].securityContext.capabilities.add"
    assert status == 422 and f"{field}: {WORDS['capabilities'].message('SYS_ADMIN')}" in body["message"], body
    assert "IPC_LOCK is not" not in body["message"] and "workers[0]" not in body["message"]
    head = tiny_run("head", ray={"head": {"template": {"spec": {"containers": [container("ray-head", "SYS_ADMIN")]}}}})
    status, body = runs.create(head)
    field = "spec.ray.head.template.spec.containers[0].securityContext.capabilities.add"
    assert status == 422 and f"{field}: SYS_ADMIN is not" in body["message"], body


def test_a_host_path_at_or_under_an_allowed_directory_is_admitted_and_slash_is_refused(
    release: Release, runs: Runs
) -> None:
    field = "spec.ray.workers[0].template.spec.volumes[0].hostPath.path"
    status, body = runs.create(mounting("ib", "/dev/infiniband"))
    assert status == 422 and f"{field}: {WORDS['hostPaths'].message('/dev/infiniband')}" in body["message"], body
    release.allow(host_paths=["/dev/infiniband"])
    eventually(lambda: runs.admitted(mounting("ib", "/dev/infiniband")), what="the directory allowed")
    assert runs.create(mounting("uverbs", "/dev/infiniband/uverbs0"))[0] == 201, "under it"
    for path in ("/", "/dev/infinibandX", "/dev/infiniband/../../etc"):
        status, body = runs.create(mounting("root", path))
        assert status == 422 and f"{field}: {WORDS['hostPaths'].message(path)}" in body["message"], (path, body)
