"""Shared fixtures: the test bed (a real Kubernetes control plane on loopback) and a namespace per test.

`control_plane` (session scope) starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok
from the binaries that `make testbed` built (hack/testbed/binaries.py finds them, controlplane.py does the work),
with our CRDs and KubeRay's installed. It starts only when a test asks for it, so unit tests never pay for it. When
the binaries are missing it fails (never skips) and says to run `make testbed`.

The fixture's object (`controlplane.ControlPlane`):
    .kubeconfig                      admin kubeconfig path (token user in system:masters)
    .kubectl(*args, input=None, check=True, timeout=120, kubeconfig=None) -> CompletedProcess[str]
    .service_account_kubeconfig(namespace, name, expiration_seconds=3600, audiences=None) -> Path
                                     (token minted through the TokenRequest API)
    .api_client(kubeconfig=None)     a `kubernetes.client.ApiClient` (admin unless a kubeconfig is given)
    .bin_dir, .kuberay_module_dir    the pinned binaries; KubeRay's module (config/crd/bases, config/rbac)
    .server, .ca_file, .admin_token, .node_names, .workdir, .startup_seconds
    .request(method, path, body=None, token=None) -> (status, body)   one raw API call (through .api, the
                                     test bed's one HTTPS client: hack/testbed/kubeapi.py)
    .get(path) -> dict | None        the object, None on 404
    .apply(*objects, namespace=None, field_manager=None)             kubectl apply of a List
    .create_namespace(name, labels=None)                              and wait for its `default` ServiceAccount
    .create_fake_node(name, ...), .start_kwok(manage_single_node=...), .wait_nodes_ready(names)
    .install_crds(paths)             server-side apply, waits until Established

`namespace` (function scope): a fresh namespace name whose `default` ServiceAccount exists; deleted after the test.

hack/testbed is on pytest's path (`pythonpath` in pyproject.toml), so tests import its modules by name
(`import controlplane`); so is tests/ (`from support import waiting`).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

import binaries
import controlplane
import errors

if TYPE_CHECKING:
    from support.uninterrupted import References

TESTBED_NODES = 2

# The per-file and per-marker time tables at the end of each run (tests/support/timing.py); the `chaos_seed`
# fixture, whose seed a failed test's report prints (tests/support/seeds.py).
pytest_plugins = ["support.timing", "support.seeds"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks every test that uses the test bed (the `control_plane` fixture, itself or through another) `cluster`.

    `make test` runs the tests without the bed (`-m "not (cluster or containers)"`) while the bed and the images
    build, then the rest: a test that starts the bed without the marker would otherwise land in the first group and
    fail there on a new machine, before the binaries exist.
    """
    for item in items:
        if "control_plane" in getattr(item, "fixturenames", ()) and item.get_closest_marker("cluster") is None:
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> References:
    """`uninterrupted(conf)`: the run of `conf`'s math trained start to end without a disturbance, once per session
    for each `config_hash` (tests/support/uninterrupted.py): the weights after each step an exact-resume test
    compares with. Asking for it starts no driver; the first call for a configuration does."""
    from support.uninterrupted import References

    return References(tmp_path_factory.mktemp("uninterrupted"))


@pytest.fixture(scope="session")
def control_plane() -> Iterator[controlplane.ControlPlane]:
    try:
        located = binaries.Binaries.locate()
    except errors.MissingBinaries as err:
        pytest.fail(str(err), pytrace=False)
    plane = controlplane.ControlPlane(located, nodes=TESTBED_NODES)
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture
def namespace(control_plane: controlplane.ControlPlane, request: pytest.FixtureRequest) -> Iterator[str]:
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower().removeprefix("test_")).strip("-")[:40].strip("-")
    name = f"t-{slug}-{uuid.uuid4().hex[:5]}"
    control_plane.create_namespace(name, labels={"trainingrun.dev/testbed": "true"})
    try:
        yield name
    finally:
        control_plane.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)
