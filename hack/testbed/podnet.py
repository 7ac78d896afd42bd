"""A container pod's own network namespace on the test bed: podman's default bridge network, and the way a pod on it
reaches the API server, which listens on 127.0.0.1 only. A TEST COMPONENT.

Who uses it: `containerpods.ContainerPods` (each container pod on the bridge: its `podman run` network options,
its IP, the API address it is given), `controlplane.ControlPlane` (the bridge's gateway among the API server's
certificate SANs, `gateway()`) and the tests.

    podman's network "podman" (bridge podman0, 10.88.0.0/16; its gateway 10.88.0.1 is the host's address on it)
      ├── a container pod: `--network podman` -> its own network namespace and IP (10.88.0.x), its ports its own;
      │   probed at that IP, as a kubelet probes a pod IP
      └── ApiRelay, on <gateway>:<port> -> 127.0.0.1:<the API server's port>: a plain TCP relay (the TLS session
          is the pod's with the API server; the API server's certificate names the gateway, credentials.py).
          KUBERNETES_SERVICE_HOST/PORT point at it: what kube-proxy's translation of the `kubernetes` Service's
          ClusterIP does in a cluster, done by the bed

Why a relay rather than the API server also listening on the gateway: kube-apiserver has one --bind-address (its
wildcard would expose it on every interface of this machine), and the bridge interface exists only while a
container runs on the network (podman removes podman0 with the last one). The relay binds with IP_FREEBIND, so it
listens on the gateway before the bridge exists and keeps listening when it comes and goes.

Traffic stays on this machine: the relay listens on the bridge's gateway only and connects to loopback only.
Standard library only, plus this directory's modules.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

import containerruntime
import proxy

log = logging.getLogger(__name__)

NETWORK = "podman"  # podman's default network (a bridge); rootful podman creates it on first use
IP_FREEBIND = getattr(socket, "IP_FREEBIND", 15)  # Linux: bind an address not (yet) on an interface
CONNECT_TIMEOUT = 5.0
MAX_CONNECTIONS = 256
DRAIN_TIMEOUT = 30.0  # after the pod closed its side, how long the API server's side may go on


@dataclass(frozen=True)
class Bridge:
    """A podman bridge network as `podman network inspect` describes it: its name, IPv4 subnet and gateway."""

    name: str
    subnet: str
    gateway: str

    def holds(self, address: str) -> bool:
        """Whether `address` is a pod's address on this bridge (inside the subnet, not the gateway)."""
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return ip in ipaddress.ip_network(self.subnet) and address != self.gateway


def parse_bridge(inspected: list[dict[str, Any]]) -> Bridge:
    """The first IPv4 subnet and its gateway from `podman network inspect NAME` (its JSON); ValueError when the
    network has none (a network that is not a bridge, or an IPv6-only one)."""
    (network,) = inspected
    for subnet in network.get("subnets") or []:
        net = ipaddress.ip_network(subnet["subnet"], strict=False)
        if net.version == 4:
            gateway = subnet.get("gateway") or str(next(net.hosts()))  # podman's default: the first host
            return Bridge(network["name"], str(net), gateway)
    raise ValueError(f"network {network.get('name')!r} has no IPv4 subnet: {network.get('subnets')}")


def bridge(name: str = NETWORK) -> Bridge:
    """podman's network `name`, read from podman; PodmanError when podman is missing or does not know it."""
    found = containerruntime.podman("network", "inspect", name, timeout=30)
    try:
        return parse_bridge(json.loads(found.stdout))
    except (ValueError, KeyError, TypeError) as err:
        raise containerruntime.PodmanError(f"podman network {name}: {err}") from err


def gateway(name: str = NETWORK) -> str | None:
    """The bridge's gateway (the host's address on it), or None on a machine without podman (the bed then
    serves no container pods; the API server's certificate names loopback only)."""
    try:
        return bridge(name).gateway
    except (containerruntime.PodmanError, OSError) as err:
        log.info("no podman bridge network (%s): the API server's certificate names loopback only", err)
        return None


def parse_container_ip(inspected: list[dict[str, Any]], network: str = NETWORK) -> str:
    """The container's IPv4 address on `network` from `podman inspect CONTAINER` (its JSON); "" when it has none
    (not running, or not on that network)."""
    (container,) = inspected
    networks = (container.get("NetworkSettings") or {}).get("Networks") or {}
    return str((networks.get(network) or {}).get("IPAddress") or "")


def container_ip(container: str, network: str = NETWORK) -> str:
    """The running container's IP on `network`; "" when podman cannot say (the container is gone)."""
    found = containerruntime.podman("inspect", "--type", "container", container, check=False, timeout=30)
    if found.returncode != 0:
        return ""
    return parse_container_ip(json.loads(found.stdout), network)


def network_namespace_inode(pid: int) -> int:
    """The inode of process `pid`'s network namespace (two processes share a namespace when these are equal)."""
    return os.stat(f"/proc/{pid}/ns/net").st_ino


@dataclass(eq=False)
class ApiRelay:
    """A TCP relay from `listen_host` (any free port) to `target` on loopback: one thread accepts, one thread per
    connection copies bytes both ways (`proxy.relay`) until the API server's side closes. `stop()` closes the
    listener and every connection."""

    listen_host: str
    target: tuple[str, int]
    address: tuple[str, int] = field(init=False, default=("", 0))
    connections: int = field(init=False, default=0)  # accepted so far (the tests read it)
    _listener: socket.socket | None = field(init=False, default=None)
    _open: set[socket.socket] = field(init=False, default_factory=set)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)
    _stopped: threading.Event = field(init=False, default_factory=threading.Event)
    _thread: threading.Thread | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if not ipaddress.ip_address(self.target[0]).is_loopback:
            raise ValueError(f"the relay forwards to loopback only, not {self.target[0]}")

    def start(self) -> ApiRelay:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.setsockopt(socket.IPPROTO_IP, IP_FREEBIND, 1)
        listener.bind((self.listen_host, 0))
        listener.listen(64)
        self._listener = listener
        self.address = listener.getsockname()[:2]
        self._thread = threading.Thread(target=self._accept, name=f"api-relay-{self.address[1]}", daemon=True)
        self._thread.start()
        log.info("API relay %s:%s -> %s:%s", *self.address, *self.target)
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
        with self._lock:
            sockets = list(self._open)
        for sock in sockets:
            proxy.close(sock)
        if self._thread is not None:
            self._thread.join(5)

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # the listener was closed (stop)
            with self._lock:
                if self._stopped.is_set() or len(self._open) >= 2 * MAX_CONNECTIONS:
                    proxy.close(client)
                    continue
                self.connections += 1
            threading.Thread(target=self._connect, args=(client,), name="api-relay-conn", daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=CONNECT_TIMEOUT)
        except OSError as err:
            log.warning("API relay: %s:%s unreachable: %s", *self.target, err)
            proxy.close(client)
            return
        with self._lock:
            if self._stopped.is_set():
                proxy.close(client)
                proxy.close(upstream)
                return
            self._open.update((client, upstream))
        try:
            # No idle bound: a watch may go quiet for long.
            proxy.relay(client, upstream, stopping=self._stopped, idle_timeout=None, drain_timeout=DRAIN_TIMEOUT)
        except OSError as err:
            log.debug("API relay connection ended: %s", err)
        finally:
            with self._lock:
                self._open.difference_update((client, upstream))
            proxy.close(client)
            proxy.close(upstream)


@dataclass(eq=False)
class PodNetwork:
    """What a container pod's network is made of: podman's bridge, and the relay by which pods on it reach the API
    server at `api` (host, port on loopback). Started lazily by its first user (`start`), stopped with the pod
    runner (`stop`)."""

    api: tuple[str, int]
    name: str = NETWORK
    bridge: Bridge | None = field(init=False, default=None)
    relay: ApiRelay | None = field(init=False, default=None)

    def start(self) -> PodNetwork:
        """Reads the bridge from podman and starts the relay on its gateway (once); PodmanError without podman."""
        if self.relay is None:
            self.bridge = bridge(self.name)
            self.relay = ApiRelay(self.bridge.gateway, self.api).start()
        return self

    def stop(self) -> None:
        if self.relay is not None:
            self.relay.stop()
            self.relay = None

    def run_options(self) -> list[str]:
        """The `podman run` options that give a container its own network namespace on the bridge."""
        return ["--network", self.name]

    def api_address(self) -> tuple[str, int]:
        """Where a pod on the bridge reaches the API server (KUBERNETES_SERVICE_HOST/PORT): the relay."""
        self.start()
        assert self.relay is not None
        return self.relay.address

    def pod_ip(self, container: str) -> str:
        """The running container's IP on the bridge (the pod's IP); "" when the container is gone."""
        return container_ip(container, self.name)
