"""A real Prometheus for the cluster tests: the test bed's pinned binary (hack/testbed/build.sh builds it), scraping
static targets every second, queried through its HTTP API (PromQL).

    with Prometheus.start(binary, ["127.0.0.1:8081"], workdir) as prom:
        prom.wait_for_target_up()
        prom.query('trainingrun_attempt{name="tiny"}')   -> [(labels, value), ...]
        prom.value('sum(trainingrun_steps_lost_total)')  -> float | None (None: no result)

`rules` (rule groups, as a PrometheusRule's spec.groups) are loaded from a rule file and evaluated every second;
`alerts()` lists what they raise.

It listens on a free loopback port and keeps its TSDB in `workdir`; stop() terminates it. Its log (`prometheus.log`
in `workdir`) is what a failed wait shows.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from typing import Any

import components
from support import waiting

SCRAPE_SECONDS = 1


class Prometheus:
    def __init__(self, process: subprocess.Popen[bytes], url: str, log: pathlib.Path) -> None:
        self.process, self.url, self.log = process, url, log

    @classmethod
    @contextlib.contextmanager
    def start(
        cls,
        binary: pathlib.Path,
        targets: Sequence[str],
        workdir: pathlib.Path,
        rules: Sequence[dict[str, Any]] = (),
    ) -> Iterator[Prometheus]:
        if not binary.is_file():
            raise FileNotFoundError(f"{binary}: no prometheus binary; run `make testbed`")
        workdir.mkdir(parents=True, exist_ok=True)
        rule_files = []
        if rules:
            rule_file = workdir / "rules.yml"
            rule_file.write_text(json.dumps({"groups": list(rules)}))
            rule_files.append(str(rule_file))
        config = workdir / "prometheus.yml"
        config.write_text(
            json.dumps(  # JSON is YAML
                {
                    "global": {"scrape_interval": f"{SCRAPE_SECONDS}s", "evaluation_interval": f"{SCRAPE_SECONDS}s"},
                    "rule_files": rule_files,
                    "scrape_configs": [
                        {
                            "job_name": "trainingrun-operator",
                            "scrape_timeout": f"{SCRAPE_SECONDS}s",
                            "static_configs": [{"targets": list(targets)}],
                        }
                    ],
                }
            )
        )
        port = components.free_port()
        log = workdir / "prometheus.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [
                    str(binary),
                    f"--config.file={config}",
                    f"--storage.tsdb.path={workdir / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=info",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        prom = cls(process, f"http://127.0.0.1:{port}", log)
        try:
            waiting.wait(prom._ready, timeout=60, what="Prometheus ready (/-/ready)", diagnostics=prom.diagnostics)
            yield prom
        finally:
            prom.stop()

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"prometheus exited with {self.process.returncode}:\n{self.diagnostics()}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def diagnostics(self) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else "(no log)"
        return "prometheus log (last 40 lines):\n" + "\n".join(text.splitlines()[-40:])

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; the `data` of a success, else AssertionError with Prometheus's error."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:  # 400/422: a bad expression; the body says why
            body = json.loads(exc.read() or b"{}")
        assert body.get("status") == "success", f"{path} {params}: {body}"
        return body["data"]

    def query(self, promql: str) -> list[tuple[dict[str, str], float]]:
        """An instant query: (labels, value) of every series of the resulting vector (a scalar: one, no labels)."""
        data = self.api("query", query=promql)
        if data["resultType"] == "scalar":
            return [({}, float(data["result"][1]))]
        assert data["resultType"] == "vector", f"{promql}: a {data['resultType']}, not a vector"
        return [(r["metric"], float(r["value"][1])) for r in data["result"]]

    def value(self, promql: str) -> float | None:
        """The single value of an instant query; None when it returns nothing."""
        found = self.query(promql)
        assert len(found) <= 1, f"{promql}: {len(found)} series, expected at most one: {found}"
        return found[0][1] if found else None

    def wait_for(self, promql: str, expected: float, timeout: float = 30.0) -> None:
        """Wait until `promql` returns `expected` (scrapes come every second)."""
        last: list[float | None] = []

        def probe() -> bool:
            last[:] = [self.value(promql)]
            return last[0] == expected

        waiting.wait(
            probe,
            timeout=timeout,
            what=f"{promql} == {expected}",
            diagnostics=lambda: f"last value: {last}\n{self.diagnostics()}",
            interval=0.5,
        )

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts the rules raise now (pending or firing): labels, annotations, state."""
        return list(self.api("alerts")["alerts"])

    def rules(self) -> list[dict[str, Any]]:
        """Every loaded rule with its health ("ok", "err" with lastError, "unknown" before its first evaluation)."""
        return [rule for group in self.api("rules")["groups"] for rule in group["rules"]]

    def wait_for_target_up(self, timeout: float = 30.0) -> None:
        waiting.wait(
            lambda: self.value('up{job="trainingrun-operator"}') == 1.0,
            timeout=timeout,
            what="the operator's target up",
            diagnostics=lambda: f"targets: {self.api('targets')}\n{self.diagnostics()}",
            interval=0.5,
        )
