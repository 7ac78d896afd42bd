"""The credentials a control plane starts with (hack/testbed/credentials.py): the admin's token file and the
ServiceAccount key pair, with `cryptography` and without it (the openssl CLI). Files in tmp_path; no cluster."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import credentials


def test_the_token_file_has_one_admin_in_system_masters_readable_by_this_user_only(tmp_path: Path) -> None:
    token = credentials.new_token()
    path = credentials.write_admin_token_file(tmp_path / "tokens.csv", token)
    assert path.read_text() == f"{token},admin,admin-uid,system:masters\n"
    assert path.stat().st_mode & 0o777 == 0o600


def test_tokens_are_long_random_hex() -> None:
    first, second = credentials.new_token(), credentials.new_token()
    assert len(first) == 64 and int(first, 16) >= 0
    assert first != second


@pytest.mark.parametrize("cryptography", [True, False], ids=["cryptography", "openssl"])
def test_the_public_key_is_the_private_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cryptography: bool
) -> None:
    if not cryptography:
        monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives", None)  # its import now fails
    private, public = tmp_path / "sa.key", tmp_path / "sa.pub"
    credentials.write_rsa_pair(private, public)
    derived = subprocess.run(
        ["openssl", "rsa", "-in", str(private), "-pubout"], check=True, capture_output=True, text=True
    ).stdout
    assert public.read_text() == derived
    assert public.read_text().startswith("-----BEGIN PUBLIC KEY-----")


def test_the_serving_names_are_loopback_the_kubernetes_service_and_the_extra_addresses_once_each() -> None:
    ips, dns = credentials.serving_names(["10.88.0.1", "127.0.0.1"])
    assert ips == ["127.0.0.1", "10.0.0.1", "10.88.0.1"]
    assert dns == ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                   "kubernetes.default.svc.cluster.local"]  # fmt: skip
    assert credentials.subject_alt_names(["127.0.0.1"], ["localhost"]) == "IP:127.0.0.1,DNS:localhost"
    with pytest.raises(ValueError):
        credentials.serving_names(["not-an-ip"])


def test_the_serving_certificate_names_the_extra_address_and_verifies_against_the_ca_on_loopback(
    tmp_path: Path,
) -> None:
    ca = credentials.write_serving_certificate(tmp_path / "certs", ["10.88.0.1"])
    leaf = tmp_path / "certs" / "apiserver.crt"
    text = subprocess.run(
        ["openssl", "x509", "-in", str(leaf), "-noout", "-ext", "subjectAltName,basicConstraints"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    assert "IP Address:127.0.0.1" in text and "IP Address:10.88.0.1" in text and "DNS:kubernetes.default.svc" in text
    assert "CA:FALSE" in text
    assert (tmp_path / "certs" / "apiserver.key").stat().st_mode & 0o777 == 0o600

    # A TLS server with the pair, on loopback; a client that trusts only the CA and checks the name.
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(leaf, tmp_path / "certs" / "apiserver.key")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        with server_context.wrap_socket(conn, server_side=True) as tls:
            tls.sendall(b"ok")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with client.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            assert tls.recv(2) == b"ok"
    thread.join(5)
    listener.close()
