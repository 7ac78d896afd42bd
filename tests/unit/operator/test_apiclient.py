"""What `apiclient.Api` puts on the wire for the run's NetworkPolicy and its events, against a local HTTP stand-in
of the API server (no cluster): the path, the method, the content type and the body."""

from __future__ import annotations

import http.server
import json
import pathlib
import threading
from collections.abc import Iterator
from typing import Any, ClassVar

import kubernetes.client
import pytest
import yaml

from trainingrun_operator.core import events, model, netpolicy
from trainingrun_operator.kube import apiclient

EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / "manifests" / "examples" / "tiny.yaml"
SPEC = model.TrainingRunSpec.model_validate(yaml.safe_load(EXAMPLE.read_text())["spec"])


class Recorder(http.server.BaseHTTPRequestHandler):
    """Answers every request with `status` and the JSON `reply`; records (method, path, content type, body)."""

    seen: ClassVar[list[tuple[str, str, str | None, Any]]] = []
    status: ClassVar[int] = 201
    reply: ClassVar[dict[str, Any]] = {}

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.seen.append((self.command, self.path, self.headers.get("Content-Type"), body))
        out = json.dumps(self.reply).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = do_PATCH = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[apiclient.Api, type[Recorder]]]:
    handler = type("Handler", (Recorder,), {"seen": [], "status": 201, "reply": {}})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    configuration = kubernetes.client.Configuration()
    configuration.host = f"http://127.0.0.1:{httpd.server_port}"
    api = apiclient.Api(configuration, threads=2)
    try:
        yield api, handler
    finally:
        api.close()
        httpd.shutdown()
        thread.join()
        httpd.server_close()


async def test_the_network_policy_is_created_as_built_and_a_409_says_it_exists(
    server: tuple[apiclient.Api, type[Recorder]],
) -> None:
    api, handler = server
    body = netpolicy.build("tiny", "ns", "u-1", SPEC, netpolicy.Sources(metrics_namespaces=("monitoring",)))
    assert await api.create_network_policy(body) is True
    handler.status, handler.reply = 409, {"kind": "Status", "reason": "AlreadyExists"}
    assert await api.create_network_policy(body) is False
    (method, path, _, sent), _ = handler.seen
    assert (method, path) == ("POST", "/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies")
    assert sent == body


async def test_the_network_policy_is_read_by_name_and_a_404_is_none(
    server: tuple[apiclient.Api, type[Recorder]],
) -> None:
    api, handler = server
    handler.status, handler.reply = 200, {"kind": "NetworkPolicy", "metadata": {"name": "tiny-ray"}}
    assert await api.get_network_policy("ns", "tiny-ray") == handler.reply
    handler.status = 404
    assert await api.get_network_policy("ns", "tiny-ray") is None
    assert handler.seen[0][:2] == ("GET", "/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies/tiny-ray")


async def test_setting_a_network_policy_back_replaces_its_whole_spec_with_a_json_patch(
    server: tuple[apiclient.Api, type[Recorder]],
) -> None:
    """A merge patch would merge the podSelector's matchLabels: a key someone added would stay, and select fewer."""
    api, handler = server
    handler.status = 200
    spec = netpolicy.build("tiny", "ns", "u-1", SPEC, netpolicy.DEFAULT)["spec"]
    await api.patch_network_policy_spec("ns", "tiny-ray", spec)
    ((method, path, content_type, sent),) = handler.seen
    assert (method, path) == ("PATCH", "/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies/tiny-ray")
    assert content_type == "application/json-patch+json"
    assert sent == [{"op": "replace", "path": "/spec", "value": spec}]


async def test_an_event_goes_on_the_wire_with_its_reason_and_type_as_plain_strings(
    server: tuple[apiclient.Api, type[Recorder]],
) -> None:
    """What `kubectl get events --field-selector reason=WorkerLost,type=Warning` selects on."""
    api, handler = server
    run = {"metadata": {"name": "tiny", "namespace": "ns", "uid": "u-1"}}
    await api.post_event(run, events.Type.WARNING, events.Reason.WORKER_LOST, "worker pod w-1 lost")
    ((method, path, _, sent),) = handler.seen
    assert (method, path) == ("POST", "/api/v1/namespaces/ns/events")
    assert (sent["type"], sent["reason"], sent["message"]) == ("Warning", "WorkerLost", "worker pod w-1 lost")
    assert sent["involvedObject"]["kind"] == model.KIND and sent["involvedObject"]["name"] == "tiny"
