"""Talking to a kube-apiserver without a client library: one HTTPS request, kubeconfig files, TokenRequest.

Who calls it: `controlplane.py` (readiness probes, the admin and ServiceAccount kubeconfigs) and tests that
need a raw status code. Standard library only.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class TokenRequestFailed(RuntimeError):
    """The API server refused to mint a ServiceAccount token (missing account, or no right to ask)."""


def https_json(method: str, url: str, *, token: str | None, context: ssl.SSLContext,
                body: Any = None, content_type: str = "application/json",
                timeout: float = 10.0) -> tuple[int, Any]:
    """One HTTPS request; returns (status, decoded JSON or text). HTTP errors are returned, not raised."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        request.add_header("Content-Type", content_type)
    request.add_header("Accept", "application/json")
    try:
        with urllib.request.urlopen(request, context=context, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    text = raw.decode(errors="replace")
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def insecure_context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def write_kubeconfig(path: Path, *, server: str, ca_file: Path, user: str, token: str,
                     namespace: str = "default") -> Path:
    """A kubeconfig for one bearer token. JSON strings are valid YAML scalars, so quoting is exact."""
    q = json.dumps
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: testbed\n  cluster:\n    server: {q(server)}\n"
        f"    certificate-authority: {q(str(ca_file))}\n"
        f"users:\n- name: {q(user)}\n  user:\n    token: {q(token)}\n"
        f"contexts:\n- name: testbed\n  context:\n    cluster: testbed\n    user: {q(user)}\n"
        f"    namespace: {q(namespace)}\n"
        "current-context: testbed\n")
    path.chmod(0o600)
    return path


def kubeconfig_for_service_account(namespace: str, name: str, *, server: str, ca_file: Path, admin_token: str,
                                   out: Path, expiration_seconds: int = 3600,
                                   audiences: Sequence[str] | None = None) -> Path:
    """Mints a token for ServiceAccount `namespace/name` through the TokenRequest API and writes a kubeconfig."""
    spec: dict[str, Any] = {"expirationSeconds": expiration_seconds}
    if audiences:
        spec["audiences"] = list(audiences)
    status, body = https_json(
        "POST", f"{server}/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
        token=admin_token, context=ssl.create_default_context(cafile=str(ca_file)),
        body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})
    if status != 201:
        raise TokenRequestFailed(f"TokenRequest for serviceaccount {namespace}/{name} returned {status}: {body}")
    return write_kubeconfig(out, server=server, ca_file=ca_file, token=body["status"]["token"],
                            user=f"system:serviceaccount:{namespace}:{name}", namespace=namespace)
