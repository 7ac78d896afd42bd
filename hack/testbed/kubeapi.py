"""The test bed's one HTTPS client to the kube-apiserver (and to a component's /healthz), the kubeconfigs it
writes for a bearer token, the admin's or one minted through the TokenRequest API, and reading a status condition
out of an object it returned.

Who uses it: `controlplane.ControlPlane` (readiness probes, `request`, the admin and ServiceAccount kubeconfigs),
`podrunner.PodRunner` and `containerpods.ContainerPods` (every call they make as the kubelet, and each pod's bound
token); the chaos controls and the tests reach it through `ControlPlane.request`; `fakenodes` and the tests read
conditions (`condition`).
No client library: standard library only.

    KubeApi(server, context, token).request("PATCH", path, body, content_type=...) -> (status, JSON or text)
        one keep-alive connection per thread; HTTP errors are returned as a status, never raised
    KubeApi(...).patch_pod_status(namespace, name, body, content_type=...)   a kubelet's status report (404: gone)
    service_account_token(api, namespace, account, ...)        TokenRequest (optionally bound to a pod)
    service_account_kubeconfig(api, namespace, account, ...)   the same token, then write_kubeconfig
    condition(obj, "Ready")                                    a status condition of what an answer carried
"""

from __future__ import annotations

import http.client
import json
import logging
import ssl
import threading
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class KubeApiError(RuntimeError):
    """An API call answered a status its caller cannot go on with; the message names the call and the answer."""


class TokenRequestFailed(KubeApiError):
    """The API server refused to mint a ServiceAccount token (missing account, or no right to ask)."""


def verified_context(ca_file: Path) -> ssl.SSLContext:
    """Trusts only the API server's own CA (the self-signed certificate it wrote into its cert dir)."""
    return ssl.create_default_context(cafile=str(ca_file))


def insecure_context() -> ssl.SSLContext:
    """For readiness probes before the API server's certificate exists, and for the components' /healthz."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class KubeApi:
    """HTTPS to one server: JSON in, (status, decoded JSON or text) out; one keep-alive connection per thread."""

    def __init__(self, server: str, context: ssl.SSLContext, token: str | None, *, timeout: float = 15.0) -> None:
        parsed = urllib.parse.urlsplit(server)
        self.server = server
        self._host, self._port = parsed.hostname or "127.0.0.1", parsed.port or 443
        self._context, self._token, self._timeout = context, token, timeout
        self._local = threading.local()

    def patch_pod_status(self, namespace: str, name: str, body: dict[str, Any], *, content_type: str) -> None:
        """A pod's status as the kubelet reports it (a PATCH of pods/status). A pod deleted meanwhile (404) is no
        error; any other failure is logged, and the next report carries the whole status again."""
        status, answer = self.request(
            "PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status", body, content_type=content_type
        )
        if status not in (200, 404):
            log.warning("patching %s/%s status returned %s: %s", namespace, name, status, answer)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: str | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        """One request (this client's token unless `token`). A kept-alive connection that the server closed
        meanwhile is retried once on a new one; a failure on a new connection raises OSError or HTTPException."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if token or self._token:
            headers["Authorization"] = f"Bearer {token or self._token}"
        if data is not None:
            headers["Content-Type"] = content_type
        while True:
            conn: http.client.HTTPSConnection | None = getattr(self._local, "conn", None)
            reused = conn is not None
            if conn is None:
                conn = http.client.HTTPSConnection(self._host, self._port, context=self._context, timeout=self._timeout)
                self._local.conn = conn
            try:
                conn.request(method, path, body=data, headers=headers)
                response = conn.getresponse()
                raw = response.read()
                break
            except (OSError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if not reused:
                    raise
        text = raw.decode(errors="replace")
        try:
            return response.status, json.loads(text)
        except ValueError:
            return response.status, text

    def items(self, path: str) -> list[dict[str, Any]]:
        """The items of a list call; KubeApiError unless it answered 200."""
        status, body = self.request("GET", path)
        if status != 200:
            raise KubeApiError(f"GET {path} returned {status}: {body}")
        return list(body.get("items") or [])


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    """The status condition of type `kind` of an API object (a node, a pod), or None."""
    for cond in (obj or {}).get("status", {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def write_kubeconfig(
    path: Path, *, server: str, ca_file: Path, user: str, token: str, namespace: str = "default"
) -> Path:
    """A kubeconfig for one bearer token. JSON strings are valid YAML scalars, so quoting is exact."""
    q = json.dumps
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: testbed\n  cluster:\n    server: {q(server)}\n"
        f"    certificate-authority: {q(str(ca_file))}\n"
        f"users:\n- name: {q(user)}\n  user:\n    token: {q(token)}\n"
        f"contexts:\n- name: testbed\n  context:\n    cluster: testbed\n    user: {q(user)}\n"
        f"    namespace: {q(namespace)}\n"
        "current-context: testbed\n"
    )
    path.chmod(0o600)
    return path


def service_account_token(
    api: KubeApi,
    namespace: str,
    account: str,
    *,
    expiration_seconds: int = 3600,
    audiences: Sequence[str] | None = None,
    bound_pod: dict[str, Any] | None = None,
) -> str:
    """Mints a token for ServiceAccount `namespace/account` through the TokenRequest API (with an admin `api`).
    `bound_pod` (the pod object) binds the token to that pod, as a kubelet's projected token is: it stops working
    once the pod is gone."""
    spec: dict[str, Any] = {"expirationSeconds": expiration_seconds}
    if audiences:
        spec["audiences"] = list(audiences)
    if bound_pod is not None:
        meta = bound_pod["metadata"]
        spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token"
    status, body = api.request(
        "POST", path, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    )
    if status != 201:
        bound = f" (bound to pod {bound_pod['metadata']['name']})" if bound_pod is not None else ""
        raise TokenRequestFailed(
            f"TokenRequest for serviceaccount {namespace}/{account}{bound} returned {status}: {body}"
        )
    return str(body["status"]["token"])


def service_account_kubeconfig(
    api: KubeApi,
    namespace: str,
    account: str,
    *,
    ca_file: Path,
    out: Path,
    expiration_seconds: int = 3600,
    audiences: Sequence[str] | None = None,
    bound_pod: dict[str, Any] | None = None,
) -> Path:
    """A token from `service_account_token` (same arguments) in a kubeconfig written to `out`."""
    token = service_account_token(
        api, namespace, account, expiration_seconds=expiration_seconds, audiences=audiences, bound_pod=bound_pod
    )
    return write_kubeconfig(
        out,
        server=api.server,
        ca_file=ca_file,
        token=token,
        user=f"system:serviceaccount:{namespace}:{account}",
        namespace=namespace,
    )
