"""The kubelet's probes as the pod runner plays them (hack/testbed/probes.py): the probe read from a container
spec, the counting of results into a verdict, and one HTTP check against a loopback server."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import probes

CHART_CONTAINER: dict[str, Any] = {
    "name": "operator",
    "ports": [{"name": "health", "containerPort": 18080}, {"name": "metrics", "containerPort": 18081}],
    "livenessProbe": {
        "httpGet": {"path": "/healthz", "port": "health"},
        "initialDelaySeconds": 10,
        "periodSeconds": 15,
        "timeoutSeconds": 5,
        "failureThreshold": 4,
    },
}


def test_the_charts_liveness_probe_is_read_with_its_named_port_resolved() -> None:
    probe = probes.read(CHART_CONTAINER, "livenessProbe")
    assert probe == probes.Probe(
        kind="livenessProbe", path="/healthz", port=18080, initial_delay=10, period=15, timeout=5, failure_threshold=4
    )
    assert probe.url("127.0.0.1") == "http://127.0.0.1:18080/healthz"
    assert probes.read(CHART_CONTAINER, "readinessProbe") is None


def test_the_kubelets_defaults_fill_what_the_spec_leaves_out() -> None:
    probe = probes.read({"name": "c", "readinessProbe": {"httpGet": {"port": 80}}}, "readinessProbe")
    assert probe is not None
    assert (probe.path, probe.period, probe.timeout, probe.failure_threshold, probe.success_threshold) == (
        "/",
        10,
        1,
        3,
        1,
    )


@pytest.mark.parametrize(
    "spec",
    [
        {"exec": {"command": []}},
        {"tcpSocket": {"port": 80}},
        {"httpGet": {"port": "nope"}},
    ],
)
def test_a_probe_the_runner_cannot_play_is_refused(spec: dict[str, Any]) -> None:
    with pytest.raises(probes.Unsupported):
        probes.read({"name": "c", "livenessProbe": spec}, "livenessProbe")


def test_a_liveness_verdict_fails_only_after_failure_threshold_failures_in_a_row() -> None:
    tally = probes.Tally(probes.Probe(kind="livenessProbe", path="/", port=1, failure_threshold=3))
    assert tally.passing  # liveness starts passing
    assert [tally.record(ok) for ok in (False, False, True, False, False)] == [None] * 5  # a success resets
    assert tally.record(False) is False
    assert tally.record(False) is None  # said once


def test_a_readiness_verdict_starts_failing_and_passes_after_success_threshold_successes() -> None:
    tally = probes.Tally(probes.Probe(kind="readinessProbe", path="/", port=1, success_threshold=2))
    assert not tally.passing
    assert tally.record(True) is None
    assert tally.record(True) is True
    assert [tally.record(False) for _ in range(3)] == [None, None, False]


class Health(http.server.BaseHTTPRequestHandler):
    hang = threading.Event()

    def do_GET(self) -> None:
        if self.path == "/slow":
            self.hang.wait(5)
        self.send_response(200 if self.path in ("/healthz", "/slow") else 500)
        self.end_headers()

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[int]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(httpd.server_address[1])
    finally:
        Health.hang.set()
        httpd.shutdown()
        httpd.server_close()
        Health.hang.clear()


def test_a_check_passes_on_2xx_and_fails_on_an_error_status_a_timeout_or_a_refused_connection(server: int) -> None:
    def probe(path: str, port: int = server) -> probes.Probe:
        return probes.Probe(kind="livenessProbe", path=path, port=port, timeout=0.5)

    assert probes.check(probe("/healthz"), "127.0.0.1") == (True, "HTTP probe returned statuscode: 200")
    assert probes.check(probe("/broken"), "127.0.0.1") == (False, "HTTP probe failed with statuscode: 500")
    ok, detail = probes.check(probe("/slow"), "127.0.0.1")
    assert not ok and "context deadline exceeded" in detail, detail
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    ok, detail = probes.check(probe("/healthz", closed), "127.0.0.1")
    assert not ok and "refused" in detail, detail


def test_an_exec_probe_runs_its_command_in_the_container_and_passes_on_exit_code_0() -> None:
    spec = {"exec": {"command": ["bash", "-c", "wget -q -O- http://localhost:52365/ | grep success"]}}
    probe = probes.read({"name": "ray-head", "readinessProbe": {**spec, "timeoutSeconds": 2}}, "readinessProbe")
    assert probe is not None and probe.command[0] == "bash" and probe.timeout == 2
    ran: list[tuple[list[str], float]] = []

    def run(command: list[str], timeout: float) -> tuple[int | None, str]:
        ran.append((command, timeout))
        return 0, "success\n"

    assert probes.check_exec(probe, run) == (True, "success")
    assert ran == [(list(probe.command), 2.0)]


@pytest.mark.parametrize(
    ("result", "detail"),
    [((1, ""), "command exited with 1"), ((None, ""), "timed out after 1s"), ((2, "wget: refused\n"), "refused")],
)
def test_an_exec_probe_fails_on_another_exit_code_or_its_timeout_and_says_why(
    result: tuple[int | None, str], detail: str
) -> None:
    probe = probes.read({"name": "c", "livenessProbe": {"exec": {"command": ["false"]}}}, "livenessProbe")
    assert probe is not None
    ok, said = probes.check_exec(probe, lambda command, timeout: result)
    assert not ok and detail in said
