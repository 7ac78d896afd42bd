"""The credentials a control plane starts with, written into its run directory: the admin's static token (the
API server's token file) and the key pair that signs and checks ServiceAccount tokens.

Who uses it: `controlplane.ControlPlane` (its start-up), before the API server and the controller manager start.
Tokens minted later for ServiceAccounts come from the TokenRequest API (`kubeapi.service_account_kubeconfig`).

    tokens.csv          <token>,admin,admin-uid,system:masters     (--token-auth-file; mode 0600)
    sa.key / sa.pub     RSA 2048, PEM: the API server signs with sa.key and checks with sa.pub; the controller
                        manager signs with sa.key

Standard library, plus `cryptography` when installed (else the openssl CLI).
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

ADMIN_GROUP = "system:masters"


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
