"""A small, bounded HTTP forward proxy on loopback: the test bed's stand-in for cluster DNS and Service routing.

Who calls it: `podrunner.PodRunner` (which owns one and updates its route table as Ray heads come and go) and the
tests. It is a TEST COMPONENT: in a cluster, `<head-svc>.<ns>.svc.cluster.local:8265` resolves to the head pod;
here a Ray pod is a local process (or a container on the bed's bridge), so the KubeRay operator gets
`HTTP_PROXY=http://127.0.0.1:<port>` and this proxy maps that name to the local Ray dashboard (or the head
container's address). (The API server's own service proxy cannot: it refuses loopback targets.)

    KubeRay ──GET http://raycluster-head-svc.ns.svc.cluster.local:8265/api/jobs/x──> proxy ──> 127.0.0.1:<dash>
                                      (absolute URI; CONNECT host:port for tunnels)     route table lookup

What it does and does not do:
- Listens on 127.0.0.1 only. Routes are `host:port -> 127.0.0.1:<port>`, or to a container pod's address on the
  bed's bridge (`pod_address` says which are; no other target); an unknown host answers 502 and names the host; a
  refused upstream answers 502 too.
- One request per client connection: the request goes upstream with `Connection: close`, the response streams
  back until the upstream closes, then both sockets close. Go's and Python's clients handle that transparently.
  The body is relayed as bytes, never parsed, so Content-Length, chunked and `Expect: 100-continue` all work.
- Bounded: at most `max_connections` at once (the rest get 503), request heads of at most 64 KiB read within
  `header_timeout`, relays closed after `idle_timeout` seconds without a byte in either direction.
- `stop()` closes the listener and every open connection and joins the threads.

Standard library only.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
}
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


class BadRequest(Exception):
    """The client sent something this proxy cannot forward (answered 400; retrying the same request is useless)."""


@dataclass
class ProxyStats:
    """Counters the tests read; updated under the proxy's lock."""

    accepted: int = 0
    forwarded: int = 0
    tunnelled: int = 0
    unrouted: int = 0
    upstream_errors: int = 0
    rejected_busy: int = 0
    bad_requests: int = 0
    active: int = 0


def split_host_port(authority: str, default_port: int) -> tuple[str, int]:
    """`host[:port]` (IPv6 in brackets allowed) -> (lowercased host, port)."""
    authority = authority.strip()
    if authority.startswith("["):
        host, _, rest = authority[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        host, sep, port = authority.rpartition(":")
        if not sep:
            host, port = authority, ""
    if not host:
        raise BadRequest(f"no host in {authority!r}")
    try:
        number = int(port) if port else default_port
    except ValueError as err:
        raise BadRequest(f"bad port in {authority!r}") from err
    if not 0 < number < 65536:
        raise BadRequest(f"bad port in {authority!r}")
    return host.lower().rstrip("."), number


@dataclass(frozen=True)
class RequestHead:
    """The parsed request line and headers of one proxied request."""

    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]
    rest: bytes  # bytes read past the head (the start of the body)


def parse_head(raw: bytes) -> RequestHead:
    head, _, rest = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(f"bad request line {lines[0][:200]!r}")
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise BadRequest(f"bad header line {line[:200]!r}")
        headers.append((name, value.strip()))
    return RequestHead(method=parts[0].upper(), target=parts[1], version=parts[2], headers=headers, rest=rest)


@dataclass(eq=False)
class ForwardProxy:
    """The proxy; `start()` binds 127.0.0.1:`port` (0 picks a free one) and serves in background threads."""

    port: int = 0
    max_connections: int = 64
    header_timeout: float = 10.0
    connect_timeout: float = 5.0
    idle_timeout: float = 120.0

    # Whether an address other than loopback may be a route's target: a pod's address on the bed's container
    # bridge (podnet.Bridge.holds), set by the pod runner when it runs Ray pods as containers. Nothing else is.
    pod_address: Callable[[str], bool] = field(default=lambda _address: False)

    stats: ProxyStats = field(init=False, default_factory=ProxyStats)
    _routes: dict[tuple[str, int], tuple[str, int]] = field(init=False, default_factory=dict)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)
    _listener: socket.socket | None = field(init=False, default=None)
    _acceptor: threading.Thread | None = field(init=False, default=None)
    _workers: set[threading.Thread] = field(init=False, default_factory=set)
    _open: set[socket.socket] = field(init=False, default_factory=set)
    _stopping: threading.Event = field(init=False, default_factory=threading.Event)

    # -- routes -------------------------------------------------------------------------------------------

    def set_route(self, authority: str, target_port: int, target_host: str = "127.0.0.1") -> None:
        """Routes `host:port` (port defaults to 80) to `target_host:target_port`, which must be loopback or a pod's
        address on the bed's container bridge (`pod_address`)."""
        if target_host not in _LOOPBACK and not self.pod_address(target_host):
            raise ValueError(f"route targets must be loopback or a container pod's address, not {target_host!r}")
        key = split_host_port(authority, 80)
        host = "127.0.0.1" if target_host in _LOOPBACK else target_host
        with self._lock:
            self._routes[key] = (host, target_port)
        log.info("proxy route %s:%d -> %s:%d", *key, host, target_port)

    def remove_route(self, authority: str) -> None:
        key = split_host_port(authority, 80)
        with self._lock:
            self._routes.pop(key, None)
        log.info("proxy route %s:%d removed", *key)

    def routes(self) -> dict[str, int]:
        """authority -> target port (see `targets` for the host as well)."""
        with self._lock:
            return {f"{host}:{port}": target[1] for (host, port), target in self._routes.items()}

    def targets(self) -> dict[str, tuple[str, int]]:
        """authority -> (target host, target port)."""
        with self._lock:
            return {f"{host}:{port}": target for (host, port), target in self._routes.items()}

    def lookup(self, host: str, port: int) -> int | None:
        """The target port of a route to loopback, None when there is none (or it leads to a container pod)."""
        target = self.target(host, port)
        return target[1] if target is not None and target[0] == "127.0.0.1" else None

    def target(self, host: str, port: int) -> tuple[str, int] | None:
        with self._lock:
            return self._routes.get((host.lower().rstrip("."), port))

    # -- life cycle ---------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """`http://127.0.0.1:<port>`, the value for HTTP_PROXY."""
        if self._listener is None:
            raise RuntimeError("proxy not started")
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ForwardProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        listener.settimeout(0.2)
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._stopping.clear()
        self._acceptor = threading.Thread(target=self._accept_loop, name=f"proxy-accept-{self.port}", daemon=True)
        self._acceptor.start()
        log.info("forward proxy listening on %s", self.url)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Closes the listener and every open connection, then joins the threads; idempotent."""
        self._stopping.set()
        if self._acceptor is not None:
            self._acceptor.join(timeout)
            self._acceptor = None
        if self._listener is not None:
            self._listener.close()
        with self._lock:
            for sock in list(self._open):
                close(sock)
            workers = list(self._workers)
        deadline = time.monotonic() + timeout
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> ForwardProxy:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    # -- serving ------------------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stopping.is_set():
                    return
                raise
            with self._lock:
                self.stats.accepted += 1
                busy = self.stats.active >= self.max_connections
                if busy:
                    self.stats.rejected_busy += 1
                else:
                    self.stats.active += 1
                    self._open.add(client)
            if busy:
                client.settimeout(1.0)
                _send_error(client, 503, "proxy busy: too many connections")
                close(client)
                continue
            worker = threading.Thread(target=self._serve, args=(client,), name="proxy-conn", daemon=True)
            with self._lock:
                self._workers.add(worker)
            worker.start()

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        try:
            head = self._read_head(client)
            if head.method == "CONNECT":
                host, port = split_host_port(head.target, 443)
            elif head.target.lower().startswith("http://"):
                authority = head.target[len("http://") :].split("/", 1)[0]
                host, port = split_host_port(authority, 80)
            else:
                raise BadRequest(f"not a proxy request (need an absolute http:// URI or CONNECT): {head.target!r}")
            target = self.target(host, port)
            if target is None:
                with self._lock:
                    self.stats.unrouted += 1
                _send_error(client, 502, f"no route for {host}:{port} in the test-bed proxy")
                return
            try:
                upstream = socket.create_connection(target, timeout=self.connect_timeout)
            except OSError as err:
                with self._lock:
                    self.stats.upstream_errors += 1
                _send_error(client, 502, f"{host}:{port} -> {target[0]}:{target[1]}: {err}")
                return
            with self._lock:
                self._open.add(upstream)
            if head.method == "CONNECT":
                with self._lock:
                    self.stats.tunnelled += 1
                client.sendall(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                if head.rest:
                    upstream.sendall(head.rest)
            else:
                with self._lock:
                    self.stats.forwarded += 1
                upstream.sendall(_origin_form(head, host, port))
            relay(client, upstream, stopping=self._stopping, idle_timeout=self.idle_timeout)
        except BadRequest as err:
            with self._lock:
                self.stats.bad_requests += 1
            _send_error(client, 400, str(err))
        except OSError as err:
            log.debug("proxy connection ended: %s", err)
        finally:
            for sock in (client, upstream):
                if sock is not None:
                    close(sock)
            with self._lock:
                self._open.discard(client)
                if upstream is not None:
                    self._open.discard(upstream)
                self.stats.active -= 1
                self._workers.discard(threading.current_thread())

    def _read_head(self, client: socket.socket) -> RequestHead:
        deadline = time.monotonic() + self.header_timeout
        buffer = b""
        while b"\r\n\r\n" not in buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BadRequest("request head not received in time")
            if len(buffer) > MAX_HEAD_BYTES:
                raise BadRequest(f"request head larger than {MAX_HEAD_BYTES} bytes")
            client.settimeout(remaining)
            try:
                chunk = client.recv(16384)
            except TimeoutError as err:
                raise BadRequest("request head not received in time") from err
            if not chunk:
                raise OSError("client closed before sending a request")
            buffer += chunk
        return parse_head(buffer)


def relay(
    client: socket.socket,
    upstream: socket.socket,
    *,
    stopping: threading.Event,
    idle_timeout: float | None,
    drain_timeout: float | None = None,
) -> None:
    """Copies bytes both ways until the upstream closes, `stopping` is set, or nothing moves for `idle_timeout`
    seconds (None: no bound); a client's half-close is passed on and the upstream's answer read for at most
    `drain_timeout` seconds more (None: no bound). Also the test bed's relay to the API server (`podnet`)."""
    client.setblocking(False)
    upstream.setblocking(False)
    peer = {client: upstream, upstream: client}
    with selectors.DefaultSelector() as selector:
        selector.register(client, selectors.EVENT_READ)
        selector.register(upstream, selectors.EVENT_READ)
        last = time.monotonic()
        drained_by: float | None = None  # set when the client half-closed, with a drain_timeout
        while not stopping.is_set():
            if drained_by is not None and time.monotonic() > drained_by:
                return
            events = selector.select(timeout=0.5)
            if not events:
                if idle_timeout is not None and time.monotonic() - last > idle_timeout:
                    log.debug("relay idle for %.0fs; closing", idle_timeout)
                    return
                continue
            last = time.monotonic()
            for key, _ in events:
                source: socket.socket = key.fileobj  # type: ignore[assignment]
                try:
                    data = source.recv(65536)
                except BlockingIOError:
                    continue
                if not data:
                    if source is upstream:
                        return
                    # The client finished sending (half close); keep reading the response.
                    selector.unregister(client)
                    if drain_timeout is not None:
                        drained_by = time.monotonic() + drain_timeout
                    try:
                        upstream.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                    continue
                _send_all(peer[source], data, idle_timeout)


def _origin_form(head: RequestHead, host: str, port: int) -> bytes:
    """The request as the origin server expects it: a path, not an absolute URI; hop-by-hop headers dropped;
    `Connection: close` so that one request is one connection."""
    after_scheme = head.target[len("http://") :]
    path = "/" + after_scheme.split("/", 1)[1] if "/" in after_scheme else "/"
    connection_tokens = {
        token.strip().lower()
        for name, value in head.headers
        if name.lower() in ("connection", "proxy-connection")
        for token in value.split(",")
    }
    lines = [f"{head.method} {path} {head.version}"]
    has_host = False
    for name, value in head.headers:
        lowered = name.lower()
        if lowered in _HOP_BY_HOP or lowered in connection_tokens:
            continue
        has_host |= lowered == "host"
        lines.append(f"{name}: {value}")
    if not has_host:
        lines.append(f"Host: {host}:{port}")
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + head.rest


def _send_all(sock: socket.socket, data: bytes, timeout: float | None) -> None:
    """sendall for a non-blocking socket, bounded by `timeout` without progress (None: no bound)."""
    view = memoryview(data)
    with selectors.DefaultSelector() as selector:
        selector.register(sock, selectors.EVENT_WRITE)
        while view:
            try:
                sent = sock.send(view)
            except BlockingIOError:
                if not selector.select(timeout):
                    raise TimeoutError("peer not reading") from None
                continue
            view = view[sent:]


def _send_error(sock: socket.socket, status: int, message: str) -> None:
    reasons = {400: "Bad Request", 502: "Bad Gateway", 503: "Service Unavailable"}
    body = (message + "\n").encode()
    head = (
        f"HTTP/1.1 {status} {reasons[status]}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    try:
        sock.settimeout(2.0)
        sock.sendall(head + body)
    except OSError:
        pass


def close(sock: socket.socket) -> None:
    """Shut both directions down (the peer sees the end at once), then close."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
