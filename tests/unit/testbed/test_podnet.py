"""A container pod's network (hack/testbed/podnet.py): podman's bridge read from `podman network inspect`, a
container's address read from `podman inspect`, and the relay to the API server, here between two loopback
sockets (the bed puts it on the bridge's gateway). No podman, no cluster."""

from __future__ import annotations

import socket
import threading
import time

import pytest

import podnet

NETWORK = [
    {
        "name": "podman",
        "driver": "bridge",
        "network_interface": "podman0",
        "subnets": [{"subnet": "fd00::/64", "gateway": "fd00::1"}, {"subnet": "10.88.0.0/16", "gateway": "10.88.0.1"}],
    }
]


def test_the_bridge_is_its_first_ipv4_subnet_and_gateway_and_holds_pod_addresses_only() -> None:
    bridge = podnet.parse_bridge(NETWORK)
    assert bridge == podnet.Bridge("podman", "10.88.0.0/16", "10.88.0.1")
    assert bridge.holds("10.88.0.7")
    assert not bridge.holds("10.88.0.1") and not bridge.holds("127.0.0.1") and not bridge.holds("10.0.0.7")
    assert not bridge.holds("")


def test_a_subnet_without_a_gateway_has_its_first_host_and_a_network_without_ipv4_is_refused() -> None:
    assert podnet.parse_bridge([{"name": "n", "subnets": [{"subnet": "10.89.0.0/24"}]}]).gateway == "10.89.0.1"
    with pytest.raises(ValueError):
        podnet.parse_bridge([{"name": "n", "subnets": [{"subnet": "fd00::/64"}]}])


def test_a_containers_address_is_read_from_its_network_and_is_empty_off_it() -> None:
    inspected = [{"NetworkSettings": {"Networks": {"podman": {"IPAddress": "10.88.0.9"}}}}]
    assert podnet.parse_container_ip(inspected) == "10.88.0.9"
    assert podnet.parse_container_ip(inspected, "other") == ""
    assert podnet.parse_container_ip([{"NetworkSettings": {"Networks": {}}}]) == ""


def test_the_relay_forwards_to_loopback_only() -> None:
    with pytest.raises(ValueError):
        podnet.ApiRelay("127.0.0.1", ("10.88.0.1", 443))


def echo_server() -> tuple[socket.socket, threading.Thread]:
    """A loopback server that answers each connection with what it read, upper-cased, until the client's EOF."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                data = b""
                while chunk := conn.recv(4096):
                    data += chunk
                conn.sendall(data.upper())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread


def test_the_relay_carries_both_ways_until_each_side_closes_and_stops_clean() -> None:
    listener, _ = echo_server()
    relay = podnet.ApiRelay("127.0.0.1", listener.getsockname()[:2]).start()
    try:
        for _ in range(3):
            with socket.create_connection(relay.address, timeout=5) as client:
                client.sendall(b"x" * 100_000)
                client.shutdown(socket.SHUT_WR)  # the server answers after our EOF: the half-close is carried
                got = b""
                while chunk := client.recv(65536):
                    got += chunk
            assert got == b"X" * 100_000
        assert relay.connections == 3
        idle = socket.create_connection(relay.address, timeout=5)  # open while the relay stops
    finally:
        relay.stop()
        listener.close()
    try:
        assert idle.recv(1) == b""  # closed by the stop
    except ConnectionResetError:
        pass  # or reset
    idle.close()
    with pytest.raises(OSError):
        socket.create_connection(relay.address, timeout=2)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(t.name.startswith("api-relay") for t in threading.enumerate()):
        time.sleep(0.05)
    assert not [t.name for t in threading.enumerate() if t.name.startswith("api-relay")]


def test_the_relay_binds_its_address_before_any_interface_has_it() -> None:
    # IP_FREEBIND: the bridge's gateway exists only while a container runs on it; the relay listens before that.
    relay = podnet.ApiRelay("192.0.2.1", ("127.0.0.1", 1)).start()  # TEST-NET-1: on no interface here
    try:
        assert relay.address[0] == "192.0.2.1" and relay.address[1] > 0
    finally:
        relay.stop()
