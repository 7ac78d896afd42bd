"""The credentials a control plane starts with, written into its run directory: the admin's static token (the
API server's token file), the key pair that signs and checks ServiceAccount tokens, and the API server's serving
certificate with the CA that signed it.

Who uses it: `controlplane.ControlPlane` (its start-up), before the API server and the controller manager start.
Tokens minted later for ServiceAccounts come from the TokenRequest API (`kubeapi.service_account_kubeconfig`).

    tokens.csv          <token>,admin,admin-uid,system:masters     (--token-auth-file; mode 0600)
    sa.key / sa.pub     RSA 2048, PEM: the API server signs with sa.key and checks with sa.pub; the controller
                        manager signs with sa.key
    certs/ca.crt        a CA of the bed's own (ECDSA P-256): the cluster CA (kubeconfigs, kube-root-ca.crt)
    certs/apiserver.crt the serving certificate it signed, then the CA (the chain the API server sends), and its key
    certs/apiserver.key in apiserver.key: the API server serves the pair (--tls-cert-file, --tls-private-key-file)
                        instead of making a self-signed one. Its SANs: loopback, the `kubernetes` Service's names and
                        ClusterIP, and the addresses the caller adds (podman's bridge gateway, where container pods
                        reach it through the bed's relay: podnet.py), so that TLS verification passes there too

Standard library, plus `cryptography` when installed (else the openssl CLI) for the key pair; the openssl CLI for
the certificates.
"""

from __future__ import annotations

import ipaddress
import subprocess
import tempfile
import uuid
from pathlib import Path

ADMIN_GROUP = "system:masters"
SERVICE_IP = "10.0.0.1"  # the `kubernetes` Service's ClusterIP: the first of --service-cluster-ip-range 10.0.0.0/24
SERVICE_NAMES = ("kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local")
LOOPBACK_IPS = ("127.0.0.1",)
VALID_DAYS = 30


def new_token() -> str:
    """A random bearer token (64 hex digits)."""
    return uuid.uuid4().hex + uuid.uuid4().hex


def write_admin_token_file(path: Path, token: str) -> Path:
    """The API server's token file with one user, `admin`, in system:masters; readable by this user only."""
    path.write_text(f"{token},admin,admin-uid,{ADMIN_GROUP}\n")
    path.chmod(0o600)
    return path


def write_rsa_pair(private: Path, public: Path) -> None:
    """The service-account signing key pair: `cryptography` when installed, else the openssl CLI."""
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
    except ImportError:
        subprocess.run(["openssl", "genrsa", "-out", str(private), "2048"], check=True, capture_output=True)
        subprocess.run(
            ["openssl", "rsa", "-in", str(private), "-pubout", "-out", str(public)], check=True, capture_output=True
        )
        return
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
        )
    )
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


def serving_names(extra_ips: list[str] | tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """The API server certificate's IP and DNS SANs: loopback, the `kubernetes` Service's ClusterIP, and
    `extra_ips` (each checked, duplicates dropped); `localhost` and the Service's names."""
    ips: list[str] = []
    for ip in (*LOOPBACK_IPS, SERVICE_IP, *extra_ips):
        ip = str(ipaddress.ip_address(ip))
        if ip not in ips:
            ips.append(ip)
    return ips, ["localhost", *SERVICE_NAMES]


def subject_alt_names(ips: list[str], dns: list[str]) -> str:
    """openssl's subjectAltName value: `IP:a,IP:b,DNS:c`."""
    return ",".join([*(f"IP:{ip}" for ip in ips), *(f"DNS:{name}" for name in dns)])


def write_serving_certificate(cert_dir: Path, extra_ips: list[str] | tuple[str, ...] = ()) -> Path:
    """A CA (cert_dir/ca.crt) and the API server's serving pair signed by it (cert_dir/apiserver.crt with the
    chain, apiserver.key), for the SANs of `serving_names(extra_ips)`; returns the CA's path."""
    cert_dir.mkdir(parents=True, exist_ok=True)
    ca_crt, ca_key = cert_dir / "ca.crt", cert_dir / "ca.key"
    leaf_crt, leaf_key = cert_dir / "apiserver.crt", cert_dir / "apiserver.key"
    ips, dns = serving_names(extra_ips)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(
        "req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca_crt), "-days", str(VALID_DAYS),
        "-subj", f"/CN=trainingrun-testbed-ca@{uuid.uuid4().hex[:8]}",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch:
        csr, extensions, leaf = Path(scratch) / "apiserver.csr", Path(scratch) / "ext.cnf", Path(scratch) / "leaf.crt"
        _openssl("req", "-new", *ec, "-keyout", str(leaf_key), "-out", str(csr), "-subj", "/CN=kube-apiserver")
        extensions.write_text(
            f"subjectAltName={subject_alt_names(ips, dns)}\n"
            "basicConstraints=critical,CA:FALSE\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth\n"
        )
        _openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key),
            "-set_serial", str(uuid.uuid4().int >> 64), "-days", str(VALID_DAYS), "-extfile", str(extensions),
            "-out", str(leaf),
        )  # fmt: skip
        leaf_crt.write_text(leaf.read_text() + ca_crt.read_text())
    for key in (ca_key, leaf_key):
        key.chmod(0o600)
    return ca_crt


def _openssl(*args: str) -> None:
    done = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed ({done.returncode}): {done.stderr[-2000:]}")
