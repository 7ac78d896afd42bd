"""The command line each control-plane component starts with: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok. Pure: the arguments are built here from paths and ports, without I/O; the files they
name (certificates, tokens, keys, kubeconfigs) are written, and the processes spawned, by `controlplane`.

Who uses it: `controlplane.ControlPlane` (its start-up and `start_kwok`) and the unit tests.

Every component listens on 127.0.0.1 only. What ties them together:
    etcd            client URL ──> kube-apiserver --etcd-servers
    kube-apiserver  --token-auth-file (the admin token), signs ServiceAccount tokens with the key pair
    controllers     the admin kubeconfig for everything (no leader election: one of each); the controller
                    manager signs with the same private key and notices a dead node after NODE_MONITOR_GRACE
    kwok            the admin kubeconfig; the nodes annotated for it, or one node; their Lease duration
"""

from __future__ import annotations

from pathlib import Path

import fakenodes

SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc"
LOOPBACK = "127.0.0.1"


def etcd(*, data_dir: Path, client_url: str, peer_url: str) -> list[str]:
    """A single-member etcd without fsync (its data lives only as long as the run directory)."""
    return [
        "--name",
        "default",
        "--data-dir",
        str(data_dir),
        "--listen-client-urls",
        client_url,
        "--advertise-client-urls",
        client_url,
        "--listen-peer-urls",
        peer_url,
        "--initial-advertise-peer-urls",
        peer_url,
        "--initial-cluster",
        f"default={peer_url}",
        "--unsafe-no-fsync",
        "--log-level",
        "warn",
    ]


def apiserver(*, etcd_url: str, port: int, cert_dir: Path, token_file: Path, sa_key: Path, sa_pub: Path) -> list[str]:
    """RBAC and Node authorization, static tokens (the admin's), ServiceAccount tokens signed with `sa_key`, a
    serving certificate from `cert_dir` (apiserver.crt and .key, credentials.write_serving_certificate); no
    endpoint reconciler."""
    return [
        "--etcd-servers",
        etcd_url,
        "--tls-cert-file",
        str(cert_dir / "apiserver.crt"),
        "--tls-private-key-file",
        str(cert_dir / "apiserver.key"),
        "--secure-port",
        str(port),
        "--bind-address",
        LOOPBACK,
        "--advertise-address",
        LOOPBACK,
        "--service-cluster-ip-range",
        "10.0.0.0/24",
        "--authorization-mode",
        "RBAC,Node",
        "--token-auth-file",
        str(token_file),
        "--service-account-issuer",
        SERVICE_ACCOUNT_ISSUER,
        "--service-account-key-file",
        str(sa_pub),
        "--service-account-signing-key-file",
        str(sa_key),
        "--endpoint-reconciler-type",
        "none",
        "--allow-privileged",
        "--profiling=false",
    ]


def controller_manager(*, kubeconfig: Path, port: int, cert_dir: Path, sa_key: Path, root_ca: Path) -> list[str]:
    """Every controller; ServiceAccount tokens signed with `sa_key`; node health checked every 2 s, a node
    Unknown after NODE_MONITOR_GRACE."""
    return [
        *_controller(kubeconfig),
        "--secure-port",
        str(port),
        "--cert-dir",
        str(cert_dir),
        "--controllers",
        "*",
        "--service-account-private-key-file",
        str(sa_key),
        "--root-ca-file",
        str(root_ca),
        f"--node-monitor-grace-period={fakenodes.NODE_MONITOR_GRACE}",
        "--node-monitor-period=2s",
        "--kube-api-qps=100",
        "--kube-api-burst=200",
    ]


def scheduler(*, kubeconfig: Path, port: int, cert_dir: Path) -> list[str]:
    return [*_controller(kubeconfig), "--secure-port", str(port), "--cert-dir", str(cert_dir)]


def kwok(*, kubeconfig: Path, manage_single_node: str | None, annotation: str, config: Path | None) -> list[str]:
    """kwok for the nodes annotated `KWOK_ANNOTATION: <annotation>`, or for `manage_single_node` alone; `config`,
    a file of kwok Stages that replace its default pod life cycle."""
    selector = (
        ["--manage-single-node", manage_single_node]
        if manage_single_node
        else [
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={fakenodes.KWOK_ANNOTATION}={annotation}",
        ]
    )
    return [
        "--kubeconfig",
        str(kubeconfig),
        *selector,
        "--node-ip",
        LOOPBACK,
        "--server-address",
        f"{LOOPBACK}:0",
        f"--node-lease-duration-seconds={fakenodes.KWOK_NODE_LEASE_SECONDS}",
        *(["--config", str(config)] if config else []),
    ]


def _controller(kubeconfig: Path) -> list[str]:
    """What the controller manager and the scheduler share: the admin kubeconfig for all three of their uses, one
    instance (no leader election), loopback."""
    return [
        "--kubeconfig",
        str(kubeconfig),
        "--authentication-kubeconfig",
        str(kubeconfig),
        "--authorization-kubeconfig",
        str(kubeconfig),
        "--leader-elect=false",
        "--bind-address",
        LOOPBACK,
    ]
