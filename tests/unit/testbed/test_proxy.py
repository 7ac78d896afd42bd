"""The test bed's loopback forward proxy (hack/testbed/proxy.py): routing by host name, errors that say what is
missing, bounds, and a clean stop. Real sockets and a real HTTP server on loopback; no Ray, no cluster (a unit test).
"""

from __future__ import annotations

import http.client
import http.server
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

import components
import proxy
from support import waiting

HEAD_SVC = "tiny-a1-raycluster-abcde-head-svc.t-ns.svc.cluster.local"


class Recorder(http.server.BaseHTTPRequestHandler):
    """Answers every request with JSON describing what arrived (method, path, headers, body)."""

    protocol_version = "HTTP/1.1"
    server: Any

    def _answer(self) -> None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self.rfile.readline().strip(), 16)
                if size == 0:
                    self.rfile.readline()
                    break
                body += self.rfile.read(size)
                self.rfile.readline()
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.startswith("/big/"):
            payload = bytes(range(256)) * (int(self.path.rsplit("/", 1)[1]) // 256)
        else:
            payload = json.dumps(
                {
                    "method": self.command,
                    "path": self.path,
                    "headers": dict(self.headers.items()),
                    "body": body.decode(),
                    "server": self.server.name,
                }
            ).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_DELETE = _answer

    def log_message(self, *_args: Any) -> None:
        pass


def serve(name: str, host: str = "127.0.0.1") -> tuple[http.server.ThreadingHTTPServer, int]:
    server = http.server.ThreadingHTTPServer((host, 0), Recorder)
    server.name = name  # type: ignore[attr-defined]
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


@pytest.fixture
def upstream() -> Iterator[int]:
    server, port = serve("a")
    yield port
    server.shutdown()
    server.server_close()


@pytest.fixture
def fwd(upstream: int) -> Iterator[proxy.ForwardProxy]:
    with proxy.ForwardProxy(header_timeout=1.0, max_connections=4) as p:
        p.set_route(f"{HEAD_SVC}:8265", upstream)
        yield p


def via(
    p: proxy.ForwardProxy,
    url: str,
    data: bytes | None = None,
    method: str | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": p.url}))
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with opener.open(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def raw(p: proxy.ForwardProxy, data: bytes, *, read: bool = True) -> bytes:
    with socket.create_connection(("127.0.0.1", p.port), timeout=10) as sock:
        sock.sendall(data)
        if not read:
            return b""
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def test_a_routed_service_name_reaches_the_local_server_with_path_and_query(fwd: proxy.ForwardProxy) -> None:
    status, body = via(fwd, f"http://{HEAD_SVC}:8265/api/jobs/raysubmit_1?x=1")
    seen = json.loads(body)
    assert status == 200
    assert seen["path"] == "/api/jobs/raysubmit_1?x=1"
    assert seen["headers"]["Host"] == f"{HEAD_SVC}:8265"
    assert seen["headers"]["Connection"] == "close"
    assert not any(h.lower() == "proxy-connection" for h in seen["headers"])


def test_a_post_body_arrives_intact_with_content_length_and_chunked(fwd: proxy.ForwardProxy) -> None:
    payload = json.dumps({"entrypoint": "python -c 'print(1)'", "submission_id": "x" * 5000})
    status, body = via(
        fwd,
        f"http://{HEAD_SVC}:8265/api/jobs/",
        data=payload.encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    assert status == 200 and json.loads(body)["body"] == payload

    chunked = (
        f"POST http://{HEAD_SVC}:8265/api/jobs/ HTTP/1.1\r\nHost: {HEAD_SVC}:8265\r\n"
        "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    ).encode()
    answer = raw(fwd, chunked)
    assert answer.startswith(b"HTTP/1.1 200")
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["body"] == "hello world"


def test_a_large_response_streams_back_byte_for_byte(fwd: proxy.ForwardProxy) -> None:
    status, body = via(fwd, f"http://{HEAD_SVC}:8265/big/{8 * 1024 * 1024}")
    assert status == 200
    assert body == bytes(range(256)) * (8 * 1024 * 1024 // 256)


def test_an_unknown_host_gets_502_naming_the_host(fwd: proxy.ForwardProxy) -> None:
    status, body = via(fwd, "http://other-head-svc.t-ns.svc.cluster.local:8265/api/version")
    assert status == 502
    assert b"no route for other-head-svc.t-ns.svc.cluster.local:8265" in body
    status, _ = via(fwd, f"http://{HEAD_SVC}:8266/")  # same host, other port: not routed either
    assert status == 502
    assert fwd.stats.unrouted == 2


def test_a_route_can_move_and_be_removed(fwd: proxy.ForwardProxy) -> None:
    server_b, port_b = serve("b")
    try:
        fwd.set_route(f"{HEAD_SVC.upper()}:8265", port_b)  # names are case-insensitive
        assert json.loads(via(fwd, f"http://{HEAD_SVC}:8265/")[1])["server"] == "b"
        assert fwd.routes() == {f"{HEAD_SVC}:8265": port_b}
        fwd.remove_route(f"{HEAD_SVC}:8265")
        assert via(fwd, f"http://{HEAD_SVC}:8265/")[0] == 502
    finally:
        server_b.shutdown()
        server_b.server_close()


def test_a_dead_upstream_gets_502_not_a_hang(fwd: proxy.ForwardProxy) -> None:
    dead_port = components.free_port()  # nobody listens there
    fwd.set_route("dead-head-svc.ns.svc.cluster.local:8265", dead_port)
    status, body = via(fwd, "http://dead-head-svc.ns.svc.cluster.local:8265/api/version")
    assert status == 502 and b"dead-head-svc" in body
    assert fwd.stats.upstream_errors == 1


def test_a_request_that_is_not_for_a_proxy_gets_400(fwd: proxy.ForwardProxy) -> None:
    assert raw(fwd, b"GET /api/version HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 400")
    assert raw(fwd, b"garbage\r\n\r\n").startswith(b"HTTP/1.1 400")
    assert fwd.stats.bad_requests == 2


def test_connect_opens_a_tunnel_to_a_routed_name(fwd: proxy.ForwardProxy, upstream: int) -> None:
    fwd.set_route(f"{HEAD_SVC}:443", upstream)
    with socket.create_connection(("127.0.0.1", fwd.port), timeout=10) as sock:
        sock.sendall(f"CONNECT {HEAD_SVC}:443 HTTP/1.1\r\nHost: {HEAD_SVC}:443\r\n\r\n".encode())
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        conn = http.client.HTTPConnection("unused")
        conn.sock = sock
        conn.request("GET", "/through-tunnel")
        assert json.loads(conn.getresponse().read())["path"] == "/through-tunnel"
    assert raw(fwd, b"CONNECT nowhere.example:443 HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 502")


def test_connections_beyond_the_bound_get_503_and_slow_heads_time_out(fwd: proxy.ForwardProxy) -> None:
    # Four silent clients fill the bound (max_connections=4); the fifth is refused at once.
    silent = [socket.create_connection(("127.0.0.1", fwd.port)) for _ in range(4)]
    try:
        waiting.wait(lambda: fwd.stats.active >= 4, timeout=5, what="the proxy to hold four connections", interval=0.01)
        assert raw(fwd, b"").startswith(b"HTTP/1.1 503")
        assert fwd.stats.rejected_busy == 1
        # header_timeout=1s: each silent client is answered 400 and its slot freed.
        for sock in silent:
            sock.settimeout(5)
            assert sock.recv(4096).startswith(b"HTTP/1.1 400")
    finally:
        for sock in silent:
            sock.close()
    assert via(fwd, f"http://{HEAD_SVC}:8265/")[0] == 200


def test_an_idle_relay_is_closed_after_the_idle_timeout(upstream: int) -> None:
    # An upstream that accepts and never answers: the relay gives up after idle_timeout.
    with socket.socket() as mute, proxy.ForwardProxy(idle_timeout=1.0) as p:
        mute.bind(("127.0.0.1", 0))
        mute.listen()
        p.set_route("mute:80", mute.getsockname()[1])
        started = time.monotonic()
        answer = raw(p, b"GET http://mute/ HTTP/1.1\r\nHost: mute\r\n\r\n")
        assert answer == b"" and 0.9 < time.monotonic() - started < 5


def test_it_listens_on_loopback_only_and_routes_only_to_loopback(fwd: proxy.ForwardProxy) -> None:
    assert fwd._listener is not None and fwd._listener.getsockname()[0] == "127.0.0.1"
    with pytest.raises(ValueError, match="loopback or a container pod's address"):
        fwd.set_route("x:80", 80, target_host="10.0.0.7")


def test_a_route_may_lead_to_an_address_the_runner_calls_a_container_pods_and_to_no_other() -> None:
    # 127.0.0.2 stands for a head container's address on the bridge (a unit test makes no bridge): another
    # address than the proxy's own, that only `pod_address` admits.
    server, port = serve("head", host="127.0.0.2")
    try:
        with proxy.ForwardProxy(pod_address=lambda address: address == "127.0.0.2") as p:
            p.set_route(f"{HEAD_SVC}:8265", port, target_host="127.0.0.2")
            assert p.targets() == {f"{HEAD_SVC}:8265": ("127.0.0.2", port)}
            assert p.lookup(HEAD_SVC, 8265) is None  # `lookup` answers for loopback routes only
            status, body = via(p, f"http://{HEAD_SVC}:8265/api/version")
            assert status == 200 and json.loads(body)["server"] == "head", body
            with pytest.raises(ValueError, match="container pod"):
                p.set_route("x:80", 80, target_host="127.0.0.3")
    finally:
        server.shutdown()
        server.server_close()


def test_stop_closes_open_connections_and_the_listener(upstream: int) -> None:
    p = proxy.ForwardProxy(idle_timeout=60).start()
    p.set_route("slow:80", upstream)
    hanging = socket.create_connection(("127.0.0.1", p.port))
    hanging.sendall(b"POST http://slow/ HTTP/1.1\r\nHost: slow\r\nContent-Length: 100\r\n\r\npartial")
    waiting.wait(lambda: p.stats.forwarded >= 1, timeout=5, what="the partial request forwarded", interval=0.01)
    started = time.monotonic()
    p.stop()
    assert time.monotonic() - started < 3
    assert p.stats.active == 0
    hanging.settimeout(5)
    assert hanging.recv(4096) == b""
    hanging.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", p.port), timeout=1).close()
