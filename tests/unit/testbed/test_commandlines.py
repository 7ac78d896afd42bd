"""The command lines of the control plane's components (hack/testbed/commandlines.py): what ties them together
(URLs, ports, files) and the settings the tests rely on. Pure: no binary runs; the real start is
tests/integration/test_controlplane.py."""

from __future__ import annotations

from pathlib import Path

import pytest

import commandlines
import fakenodes

KUBECONFIG = Path("/run/kubeconfig")


def flag(args: list[str], name: str) -> str:
    """The value of `--name value` or `--name=value`; fails when the flag is absent or given twice."""
    values = [args[i + 1] for i, a in enumerate(args) if a == name]
    values += [a.split("=", 1)[1] for a in args if a.startswith(f"{name}=")]
    assert len(values) == 1, f"{name} in {args}"
    return values[0]


def test_etcd_serves_and_advertises_its_client_url_and_is_its_own_single_peer() -> None:
    args = commandlines.etcd(data_dir=Path("/w/etcd"), client_url="http://127.0.0.1:1", peer_url="http://127.0.0.1:2")
    assert flag(args, "--listen-client-urls") == flag(args, "--advertise-client-urls") == "http://127.0.0.1:1"
    assert flag(args, "--initial-cluster") == f"{flag(args, '--name')}=http://127.0.0.1:2"
    assert flag(args, "--data-dir") == "/w/etcd"


def test_the_apiserver_uses_etcd_the_admin_token_file_and_the_service_account_key_pair() -> None:
    args = commandlines.apiserver(
        etcd_url="http://127.0.0.1:1",
        port=6443,
        cert_dir=Path("/w/certs"),
        token_file=Path("/w/tokens.csv"),
        sa_key=Path("/w/sa.key"),
        sa_pub=Path("/w/sa.pub"),
    )
    assert flag(args, "--etcd-servers") == "http://127.0.0.1:1"
    assert flag(args, "--secure-port") == "6443" and flag(args, "--bind-address") == "127.0.0.1"
    assert flag(args, "--authorization-mode") == "RBAC,Node"
    assert flag(args, "--token-auth-file") == "/w/tokens.csv"
    assert flag(args, "--service-account-signing-key-file") == "/w/sa.key"
    assert flag(args, "--service-account-key-file") == "/w/sa.pub"
    assert flag(args, "--service-account-issuer") == commandlines.SERVICE_ACCOUNT_ISSUER


@pytest.mark.parametrize(
    "args",
    [
        commandlines.controller_manager(
            kubeconfig=KUBECONFIG, port=1, cert_dir=Path("/c"), sa_key=Path("/k"), root_ca=Path("/ca")
        ),
        commandlines.scheduler(kubeconfig=KUBECONFIG, port=1, cert_dir=Path("/c")),
    ],
    ids=["controller-manager", "scheduler"],
)
def test_each_controller_is_the_only_one_on_loopback_with_the_admin_kubeconfig(args: list[str]) -> None:
    for use in ("--kubeconfig", "--authentication-kubeconfig", "--authorization-kubeconfig"):
        assert flag(args, use) == str(KUBECONFIG)
    assert "--leader-elect=false" in args
    assert flag(args, "--bind-address") == "127.0.0.1"
    assert flag(args, "--secure-port") == "1" and flag(args, "--cert-dir") == "/c"


def test_the_controller_manager_signs_with_the_private_key_and_notices_a_dead_node_after_the_grace() -> None:
    args = commandlines.controller_manager(
        kubeconfig=KUBECONFIG, port=1, cert_dir=Path("/c"), sa_key=Path("/w/sa.key"), root_ca=Path("/w/ca.crt")
    )
    assert flag(args, "--service-account-private-key-file") == "/w/sa.key"
    assert flag(args, "--root-ca-file") == "/w/ca.crt"
    assert flag(args, "--node-monitor-grace-period") == fakenodes.NODE_MONITOR_GRACE
    assert flag(args, "--controllers") == "*"


def test_the_shared_kwok_plays_only_the_nodes_annotated_for_it() -> None:
    args = commandlines.kwok(kubeconfig=KUBECONFIG, manage_single_node=None, annotation="fake", config=None)
    assert "--manage-all-nodes=false" in args
    assert flag(args, "--manage-nodes-with-annotation-selector") == f"{fakenodes.KWOK_ANNOTATION}=fake"
    assert flag(args, "--node-lease-duration-seconds") == str(fakenodes.KWOK_NODE_LEASE_SECONDS)
    assert "--manage-single-node" not in args and "--config" not in args


def test_a_lone_nodes_kwok_plays_that_node_alone_with_the_stages_given() -> None:
    args = commandlines.kwok(
        kubeconfig=KUBECONFIG, manage_single_node="doomed-1", annotation="fake", config=Path("/stages.yaml")
    )
    assert flag(args, "--manage-single-node") == "doomed-1"
    assert flag(args, "--config") == "/stages.yaml"
    assert not any(a.startswith("--manage-nodes-with-annotation-selector") for a in args)
