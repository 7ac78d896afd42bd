"""A container's probes as the kubelet runs them: the probe read from the container spec (`read`), one HTTP check
(`check`) or exec check (`check_exec`), and the counting of results into a verdict (`Tally`).

Who uses it: `containerpods.ContainerPods` (a thread per probe of each container it runs) and its unit tests.
Standard library only; `read` and `Tally` are pure.

    read(container, "livenessProbe") -> Probe | None       httpGet (a named port resolved) or exec; Unsupported else
    check(probe, host) -> (ok, detail)                      GET http://host:port/path within timeoutSeconds:
                                                            2xx/3xx passes; a refused connection or a timeout fails
    check_exec(probe, run) -> (ok, detail)                  the command run in the container (`run`: podman exec)
                                                            within timeoutSeconds: exit code 0 passes
    Tally(probe).record(ok) -> True | False | None          the verdict when it changes: failureThreshold failures
                                                            in a row fail it, successThreshold successes pass it

As the kubelet: a liveness probe starts passing and a readiness probe failing; results count from
initialDelaySeconds after the container started, one check every periodSeconds; a failed liveness verdict kills
the container (its probe's terminationGracePeriodSeconds, else the pod's), and the restarted one starts a new tally.
"""

from __future__ import annotations

import http.client
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

USER_AGENT = "kube-probe/1.35"


class Unsupported(ValueError):
    """The pod asks for something the bed's container runtime does not do (a tcpSocket or grpc probe, a volume
    it cannot make); the message names the field. The pod does not start."""


@dataclass(frozen=True)
class Probe:
    """One httpGet or exec probe of a container, with the kubelet's defaults for what the spec leaves out."""

    kind: str  # livenessProbe | readinessProbe
    path: str = ""  # httpGet
    port: int = 0  # httpGet
    command: tuple[str, ...] = ()  # exec: what runs in the container (no shell unless it names one)
    scheme: str = "HTTP"
    initial_delay: float = 0.0
    period: float = 10.0
    timeout: float = 1.0
    failure_threshold: int = 3
    success_threshold: int = 1
    termination_grace: float | None = None  # the probe's own terminationGracePeriodSeconds, if set

    def url(self, host: str) -> str:
        return f"{self.scheme.lower()}://{host}:{self.port}{self.path}"


def read(container: dict[str, Any], kind: str) -> Probe | None:
    """The container's `kind` probe (livenessProbe, readinessProbe), None when it has none."""
    spec = container.get(kind)
    if not spec:
        return None
    grace = spec.get("terminationGracePeriodSeconds")
    timing = {
        "initial_delay": float(spec.get("initialDelaySeconds", 0)),
        "period": float(spec.get("periodSeconds", 10)),
        "timeout": float(spec.get("timeoutSeconds", 1)),
        "failure_threshold": int(spec.get("failureThreshold", 3)),
        "success_threshold": int(spec.get("successThreshold", 1)),
        "termination_grace": None if grace is None else float(grace),
    }
    if "exec" in spec:
        command = (spec["exec"] or {}).get("command") or []
        if not command:
            raise Unsupported(f"{container['name']}.{kind}.exec.command is empty")
        return Probe(kind=kind, command=tuple(str(c) for c in command), **timing)
    if "httpGet" not in spec:
        raise Unsupported(f"{container['name']}.{kind}: only httpGet and exec probes are played ({sorted(spec)})")
    get = spec["httpGet"]
    port = get["port"]
    if isinstance(port, str) and not port.isdigit():
        named = {p.get("name"): p["containerPort"] for p in container.get("ports") or []}
        if port not in named:
            raise Unsupported(f"{container['name']}.{kind}: no container port named {port!r}")
        port = named[port]
    return Probe(kind=kind, path=get.get("path") or "/", port=int(port), scheme=get.get("scheme") or "HTTP", **timing)


def check(probe: Probe, host: str) -> tuple[bool, str]:
    """One check, as the kubelet's HTTP prober: GET within the probe's timeout; 200-399 passes. Returns whether it
    passed and what the kubelet would say about it."""
    request = urllib.request.Request(probe.url(host), headers={"User-Agent": USER_AGENT, "Accept": "*/*"})
    try:
        with urllib.request.urlopen(request, timeout=probe.timeout) as response:
            status = int(response.status)
    except urllib.error.HTTPError as err:
        return False, f"HTTP probe failed with statuscode: {err.code}"
    except (OSError, http.client.HTTPException) as err:
        reason = getattr(err, "reason", err)
        if isinstance(reason, TimeoutError) or isinstance(err, TimeoutError):
            return False, f'Get "{probe.url(host)}": context deadline exceeded (Client.Timeout exceeded)'
        return False, f'Get "{probe.url(host)}": {reason}'
    return (200 <= status < 400), f"HTTP probe returned statuscode: {status}"


# (command, timeout in seconds) -> (exit code, output); None for the exit code when the timeout struck
Exec = Callable[[list[str], float], tuple[int | None, str]]


def check_exec(probe: Probe, run: Exec) -> tuple[bool, str]:
    """One check, as the kubelet's exec prober: the probe's command run in the container (`run`) within the
    probe's timeout; exit code 0 passes. Returns whether it passed and what the kubelet would say about it."""
    code, output = run(list(probe.command), probe.timeout)
    if code is None:
        return False, f"command timed out: {list(probe.command)!r} timed out after {probe.timeout:g}s"
    return code == 0, output.strip()[-500:] or f"command exited with {code}"


@dataclass
class Tally:
    """The results of one probe of one container so far, counted as the kubelet counts them."""

    probe: Probe
    passing: bool = field(init=False)
    successes: int = field(init=False, default=0)
    failures: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.passing = self.probe.kind == "livenessProbe"  # liveness: Success until proven otherwise

    def record(self, ok: bool) -> bool | None:
        """Counts one result; returns the new verdict when it changes (False: failureThreshold failures in a row;
        True: successThreshold successes in a row), else None."""
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            if not self.passing and self.successes >= self.probe.success_threshold:
                self.passing = True
                return True
        else:
            self.successes, self.failures = 0, self.failures + 1
            if self.passing and self.failures >= self.probe.failure_threshold:
                self.passing = False
                return False
        return None
