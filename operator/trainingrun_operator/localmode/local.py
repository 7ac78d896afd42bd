"""Local backend: one TrainingRun on this machine, without Kubernetes, driven by the same decision core.

    trainingrun run FILE [--root DIR] [--chaos]

The file is read and checked by `runfile.load` (what is wrong, and on which line, before anything starts).
Every TICK seconds the supervisor does what the operator does on a cluster, with a driver process standing in
for the RayJob. Its run directory is DIR/local/<run>/ (`local` is local mode's namespace, as a cluster's runs live
in <root>/<namespace>/<run>/); the driver's --root is DIR/local:

    read DIR/local/<run>/attempts/<N>/runtime.json ──► status.runtime (the driver's file reporter; fenced by attempt)
    observe the attempt's driver process            ──► AttemptObservation(backend="local")
    decision.decide(...)                            ──► write DIR/local/<run>/status.json (the CR status's shape)
    act: CreateAttempt  -> spawn `python -m trainingrun_runtime ... --reporter file` (`driver_process`); one local
                           Ray node, so generation runs beside the driver whatever spec.ray.workers says
         DeleteRayJob   -> kill every process of the attempt (its local Ray goes with it); the decision asks for
                           this also when the attempt stalled (`watchdog.py`)
         EnsureIdentity -> nothing (no API server)
         Event          -> the console and DIR/local/<run>/events.jsonl
    until Succeeded or Failed; then DIR/local/<run>/reward.png (reward per step, attempts marked).

Re-running the same command resumes: status.json is read back, and an attempt whose process is not ours (the
previous supervisor stopped) ends as Preempted, so the next attempt resumes from the recorded checkpoint. A run
directory of the layout before the namespace level (DIR/<run>/ with a status.json) is moved to DIR/local/<run>/
first (`adopt_old_layout`: one machine, one namespace, so no ownership question), and that is said on the console.

The supervisor owns its drivers: when it dies, even by SIGKILL, they die too. The driver gets SIGKILL from the
kernel when the supervisor goes (`driver_process.bound_to_parent`), its local Ray goes with it, and the
supervisor's reaper (`reaper.py`, its own small process) kills whatever still carries one of this supervisor's
markers (`<run dir>#<supervisor pid>#<attempt>`). A re-run first kills what a dead supervisor of the same run
directory left behind, should its reaper have died too, so that two drivers never train side by side.
`--chaos` SIGKILLs the driver at random moments, each time after the attempt recorded a new checkpoint, to show
a resume; those kills are classified as preemptions (they are not the program's fault).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import logging
import os
import pathlib
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TextIO

from trainingrun_operator.core import decision, errors, events, goodput, model, patching, rayjob, validation
from trainingrun_operator.core.observation import AttemptObservation, PodObservation
from trainingrun_operator.core.phases import TERMINAL, Phase
from trainingrun_operator.localmode import driver_process, processes, reaper, runfile
from trainingrun_runtime import contract, timestamps

__all__ = ["NAMESPACE", "Chaos", "LocalRun", "adopt_old_layout", "marker", "read_rewards", "run_file"]

logger = logging.getLogger(__name__)

NAMESPACE = "local"
"""Local mode's namespace: run directories are DIR/local/<run>/."""
STATUS_FILE = "status.json"
_ASIDE = ".moving"
"""DIR/local.moving: an old-layout run named `local` on its way into DIR/local/local (no run name holds a dot)."""
TICK_SECONDS = 0.25
KILL_GRACE_SECONDS = 10.0
_REWARD_LINE = re.compile(r"step (\d+): reward (-?[0-9.]+(?:e-?\d+)?)")


def _write_json_atomically(path: pathlib.Path, value: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as out:
        json.dump(value, out, indent=2, sort_keys=True)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _move(source: pathlib.Path, target: pathlib.Path) -> None:
    """rename, then fsync both parents (the target's parent is created if missing, and its own parent synced)."""
    if not target.parent.exists():
        target.parent.mkdir()
        _fsync_dir(target.parent.parent)
    os.rename(source, target)
    _fsync_dir(target.parent)
    _fsync_dir(source.parent)


def adopt_old_layout(root: pathlib.Path, run: str) -> list[tuple[pathlib.Path, pathlib.Path]]:
    """Move run directories of the layout before the namespace level to DIR/local/<run>/; the moves made.

    First an old-layout run named `local` (DIR/local/status.json: it holds the namespace's place), by way of
    DIR/local.moving, so that no run directory is ever moved into it; then `run`'s own DIR/<run>/, if it has a
    status.json and DIR/local/<run>/ does not exist. A start after a crash between two renames finishes the move.
    """
    moved: list[tuple[pathlib.Path, pathlib.Path]] = []
    namespace = root / NAMESPACE
    aside = root / (NAMESPACE + _ASIDE)
    if (namespace / STATUS_FILE).is_file() and not aside.exists():
        _move(namespace, aside)
    if aside.is_dir():
        target = namespace / NAMESPACE
        if target.exists():
            logger.warning("%s is left where it is: %s exists already; move it there by hand if it is the run's",
                           aside, target)  # fmt: skip
        else:
            _move(aside, target)
            moved.append((namespace, target))
    old, new = root / run, namespace / run
    if run != NAMESPACE and (old / STATUS_FILE).is_file() and not new.exists():
        _move(old, new)
        moved.append((old, new))
    return moved


def _read_json(path: pathlib.Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError:
        return None  # never torn (the reporter renames), but a hand-edited file must not crash the supervisor
    return value if isinstance(value, dict) else None


@dataclasses.dataclass
class Chaos:
    """Kills the driver at random, at most `max_kills` times, each only after the attempt saved a checkpoint."""

    rng: random.Random
    max_kills: int = 2
    min_delay: float = 0.5
    max_delay: float = 4.0
    kills: int = 0
    due: float | None = None
    armed_for: int = 0

    def tick(
        self, proc: driver_process.DriverProcess | None, report: contract.RuntimeStatus | None, now: float
    ) -> bool:
        """True when `proc` should be killed now."""
        if proc is None or self.kills >= self.max_kills or proc.exit_code() is not None:
            return False
        checkpoint = report.get("lastCheckpoint") if report else None
        saved_here = report is not None and report.get("attempt") == proc.attempt
        if not saved_here or checkpoint is None or checkpoint.get("attempt") != proc.attempt:
            return False
        if self.armed_for != proc.attempt:
            self.armed_for, self.due = proc.attempt, now + self.rng.uniform(self.min_delay, self.max_delay)
        if self.due is not None and now >= self.due:
            self.kills += 1
            self.due = None
            return True
        return False


def marker(run_dir: pathlib.Path, supervisor: int, attempt: int | None = None) -> str:
    """MARKER_ENV of the processes of `attempt` of the run in `run_dir`, started by the supervisor with pid
    `supervisor`: `<run dir>#<supervisor>#<attempt>`; without an attempt, the prefix all of them share."""
    return f"{run_dir}#{supervisor}#{'' if attempt is None else attempt}"


def read_rewards(run_dir: pathlib.Path, attempt: int | None = None) -> dict[int, list[tuple[int, float]]]:
    """attempt -> [(step, reward)] from the drivers' logs ('step N: reward R' lines); one attempt if given."""
    found: dict[int, list[tuple[int, float]]] = {}
    pattern = f"attempts/{attempt}/driver.log" if attempt is not None else "attempts/*/driver.log"
    for log_path in sorted(run_dir.glob(pattern)):
        attempt = int(log_path.parent.name)
        text = log_path.read_text(errors="replace")
        found[attempt] = [(int(m.group(1)), float(m.group(2))) for m in _REWARD_LINE.finditer(text)]
    return found


class LocalRun:
    """Supervises one TrainingRun under DIR/local/<run>/ until it succeeds or fails."""

    def __init__(
        self,
        run: model.TrainingRun,
        root: pathlib.Path,
        *,
        chaos: Chaos | None = None,
        clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
        console: TextIO | None = None,
        files_dir: pathlib.Path | None = None,
    ) -> None:
        self.run = run
        self.files_dir = files_dir
        """The YAML file's directory: the driver imports a reward function's module from it (before PYTHONPATH)."""
        self.name = run.metadata.name
        self.root = root.resolve()
        self.namespace_root = self.root / NAMESPACE
        """The driver's --root."""
        self.dir = self.namespace_root / self.name
        self.chaos = chaos
        self.clock = clock
        self.console = console or sys.stderr
        self.procs: dict[int, driver_process.DriverProcess] = {}
        self.status: dict[str, Any] = {}

    # ---------------------------------------------------------------------------------------- state

    def adopt_old_layout(self) -> None:
        """Before anything reads the run directory: move one of the layout before the namespace level into place."""
        for source, target in adopt_old_layout(self.root, self.name):
            logger.info("moved %s to %s", source, target)
            print(f"moved the run directory {source} (layout before the namespace level) to {target}",
                  file=self.console, flush=True)  # fmt: skip

    def load_status(self) -> None:
        """status.json from a previous invocation, made ready to continue."""
        previous = _read_json(self.dir / "status.json") or {}
        if previous.get("phase") == Phase.FAILED.value:
            # A new invocation after a failure is a new try: keep history and checkpoints, reset the verdict.
            for key in ("phase", "reason", "message", "completionTime", "nextAttemptTime", "consecutiveFailures"):
                previous.pop(key, None)
            previous.pop("conditions", None)
        self.status = previous

    def save_status(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        _write_json_atomically(self.dir / "status.json", self.status)

    def current_attempt(self) -> int:
        return int((self.status.get("attempt") or {}).get("number", 0))

    def fold_report(self) -> None:
        """The current attempt's runtime.json becomes status.runtime (as the driver's merge patch would)."""
        number = self.current_attempt()
        report = _read_json(contract.report_file(self.dir, number)) if number else None
        if report is not None:
            self.status[contract.REPORT_FIELD] = report

    # -------------------------------------------------------------------------------------- observe

    def observe(self) -> AttemptObservation:
        number = self.current_attempt()
        proc = self.procs.get(number)
        others = sum(1 for n, p in self.procs.items() if n != number and p.alive())
        if proc is None:
            if number and Phase(self.status.get("phase") or "Pending") in (Phase.STARTING, Phase.RUNNING):
                gone = PodObservation(name="driver", node_type="head", disruption="SupervisorRestarted")
                return AttemptObservation(number=number, backend="local", departed=(gone,), other_pods=others)
            return AttemptObservation(number=number, backend="local", other_pods=others)
        code = proc.exit_code()
        alive = proc.alive()
        pod = PodObservation(
            name=f"driver-{proc.pid}",
            node_type="head",
            phase="Running" if code is None else ("Succeeded" if code == 0 else "Failed"),
            deleting=code is not None,
        )
        departed = (dataclasses.replace(pod, disruption=proc.killed_by),) if proc.killed_by else ()
        logged = read_rewards(self.dir, number).get(number) or []
        return AttemptObservation(
            number=number,
            backend="local",
            pods=(pod,) if (code is None or alive) else (),
            departed=departed,
            other_pods=others,
            exit_code=code if not proc.killed_by else None,
            progress_step=max((step for step, _ in logged), default=None),  # for stepsLost
            stderr_tail=proc.log_tail() if code not in (None, 0) else "",
        )

    # ------------------------------------------------------------------------------------------ act

    def spawn(self, action: decision.CreateAttempt) -> None:
        log_path = self.dir / "attempts" / str(action.number) / "driver.log"
        if self.run.spec.driver is not None:
            self._spawn_program(action, self.run.spec.driver, log_path)
            return
        args = driver_process.DriverArgs(
            run=self.name,
            attempt=action.number,
            root=str(self.namespace_root),
            config=validation.runtime_config(self.run.spec, local=True).model_dump(mode="json", by_alias=True),
            resume="latest" if action.resume is None else str(action.resume),
            fallback=",".join(str(s) for s in action.fallback) if action.resume is not None else None,
            manifest_blake3=rayjob.manifest_hashes_arg(dict(action.manifest_blake3))
            if action.resume is not None
            else None,
            run_uid=self._run_uid(),
        )
        env = {}
        if self.files_dir is not None:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.files_dir), os.environ.get("PYTHONPATH")) if p)
        proc = driver_process.spawn(args, log_path, marker=marker(self.dir, os.getpid(), action.number), env=env)
        self.procs[action.number] = proc
        logger.debug("attempt %d: pid %d", action.number, proc.pid)

    def _run_uid(self) -> str:
        """No metadata.uid without an API server: the run's first start time names this run (a fresh status.json is
        a new run, which takes the directory over from any driver of the old one)."""
        return f"local-{self.name}-{self.status.get('startTime')}"

    def _spawn_program(self, action: decision.CreateAttempt, driver: model.DriverSpec, log_path: pathlib.Path) -> None:
        """A spec.driver program as the attempt's driver, in the YAML file's directory, told its attempt in
        `contract.ATTACH_ENV` (the reporter: runtime.json, as the built-in driver's locally)."""
        attached = rayjob.attachment(
            self.name, NAMESPACE, action.number, action.resume, self.run.spec, root=str(self.namespace_root),
            reporter="file", uid=self._run_uid(), fallback=action.fallback,
            manifest_blake3=dict(action.manifest_blake3),
        )  # fmt: skip
        env = {e.name: e.value for e in driver.env or []}
        env[contract.ATTACH_ENV] = json.dumps(attached, sort_keys=True)
        cwd = str(self.files_dir) if self.files_dir is not None else None
        args = driver_process.ProgramArgs(self.name, action.number, str(self.namespace_root), driver.entrypoint, cwd)
        proc = driver_process.spawn(args, log_path, marker=marker(self.dir, os.getpid(), action.number), env=env)
        self.procs[action.number] = proc
        logger.debug("attempt %d: program pid %d", action.number, proc.pid)

    def sweep_orphans(self) -> list[int]:
        """SIGKILL what a dead supervisor of this run directory left running (its reaper died with it, or was not
        there); the pids killed. A live supervisor's processes are left alone."""
        dead: set[tuple[str, int]] = set()
        ours = (str(self.dir), str(self.root / self.name))  # the run directory, and where the old layout had it
        for value in processes.marked(driver_process.MARKER_ENV).values():
            run_dir, _, supervisor = value.rpartition("#")[0].rpartition("#")  # <run dir>#<supervisor>#<attempt>
            if run_dir in ours and supervisor.isdigit() and not processes.exists(int(supervisor)):
                dead.add((run_dir, int(supervisor)))
        killed = [
            pid
            for run_dir, sup in sorted(dead)
            for pid in reaper.sweep(driver_process.MARKER_ENV, marker(pathlib.Path(run_dir), sup))
        ]
        if killed:
            logger.warning(
                "killed %d processes left by earlier supervisors %s of %s",
                len(killed),
                sorted(sup for _, sup in dead),
                self.dir,
            )
        return killed

    def act(self, action: decision.Action) -> None:
        if isinstance(action, decision.CreateAttempt):
            if action.number not in self.procs:
                self.spawn(action)
        elif isinstance(action, decision.DeleteRayJob):
            for proc in self.procs.values():
                if proc.alive():
                    proc.kill("Stopped")
        elif isinstance(action, decision.Event):
            self.event(action)

    def event(self, event: decision.Event) -> None:
        now = timestamps.rfc3339(self.clock(), timespec="seconds")
        kind, reason = event.type.value, event.reason.value  # what the API server would keep: the wire values
        with open(self.dir / "events.jsonl", "a") as out:
            out.write(json.dumps({"time": now, "type": kind, "reason": reason, "message": event.message}) + "\n")
        print(f"{now} {kind:7} {reason}: {event.message}", file=self.console, flush=True)

    # ----------------------------------------------------------------------------------------- loop

    def step(self) -> decision.Decision:
        """One supervisor pass."""
        self.fold_report()
        if self.chaos is not None:
            proc = self.procs.get(self.current_attempt())
            if self.chaos.tick(proc, self.status.get(contract.REPORT_FIELD), time.monotonic()):
                assert proc is not None
                self.event(
                    decision.Event(
                        events.Type.WARNING,
                        events.Reason.CHAOS_KILL,
                        f"--chaos: SIGKILL to attempt {proc.attempt}'s driver (pid {proc.pid})",
                    )
                )
                proc.kill("ChaosKill")
        result = decision.decide(
            decision.Inputs(
                run=self.name,
                namespace="local",
                generation=1,
                spec=self.run.spec,
                status=model.TrainingRunStatus.model_validate(self.status),
                observed=self.observe(),
                now=self.clock(),
            )
        )
        self.status = patching.apply(self.status, result.patch)
        self.save_status()
        for action in result.actions:
            self.act(action)
        return result

    def supervise(self, on_tick: Callable[[LocalRun], None] | None = None) -> Phase:
        """Pass after pass until the run is Succeeded or Failed; every driver is gone on return."""
        self.adopt_old_layout()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.load_status()
        self.sweep_orphans()
        guard = reaper.start(driver_process.MARKER_ENV, marker(self.dir, os.getpid()), self.dir / "reaper.log")
        try:
            while True:
                result = self.step()
                if on_tick is not None:
                    on_tick(self)
                if result.phase in TERMINAL:
                    self.reap()
                    return result.phase
                time.sleep(TICK_SECONDS)
        finally:
            self.reap()
            guard.stop()

    def reap(self) -> None:
        for proc in self.procs.values():
            if proc.alive():
                proc.kill("Stopped")
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(KILL_GRACE_SECONDS)


# ------------------------------------------------------------------------------------------ the command


@contextlib.contextmanager
def _progress(run: LocalRun) -> Iterator[Callable[[LocalRun], None]]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    total = int(run.run.spec.trainer.get("steps", 200))
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[extra]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task(run.name, total=total, extra="")
        run.console = bar.console.file

        def update(current: LocalRun) -> None:
            status = current.status
            runtime: contract.RuntimeStatus | None = status.get(contract.REPORT_FIELD)
            rewards = read_rewards(current.dir, current.current_attempt()).get(current.current_attempt()) or []
            step = max([(runtime.get("step") if runtime else None) or 0, *(s for s, _ in rewards)])
            reward = rewards[-1][1] if rewards else (runtime.get("reward") if runtime else None)
            latest = ((status.get("checkpoints") or {}).get("latest") or {}).get("step")
            bar.update(
                task,
                completed=step,
                description=f"{current.name} attempt {current.current_attempt()} {status.get('phase', '')}",
                extra=f"reward {reward:.3f} ckpt {latest}" if reward is not None else f"ckpt {latest}",
            )

        yield update


def plot_rewards(run_dir: pathlib.Path, status: Mapping[str, Any]) -> pathlib.Path | None:
    """reward.png: reward per step, one colour per attempt, resume points marked. None without matplotlib, or when
    no attempt logged a reward (a spec.driver program that reports none)."""
    rewards = {attempt: points for attempt, points in sorted(read_rewards(run_dir).items()) if points}
    if not rewards:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed; no reward plot")
        return None
    figure, axes = plt.subplots(figsize=(8, 4))
    for attempt, points in rewards.items():
        axes.plot([s for s, _ in points], [r for _, r in points], marker=".", label=f"attempt {attempt}")
    for record in status.get("attempts") or []:
        if record.get("resumedFrom") is not None:
            axes.axvline(record["resumedFrom"], color="grey", linestyle=":", linewidth=1)
    axes.set_xlabel("step")
    axes.set_ylabel("reward")
    axes.set_title(f"{run_dir.name}: reward per step (dotted: resume points)")
    axes.legend(loc="lower right")
    figure.tight_layout()
    out = run_dir / "reward.png"
    figure.savefig(out, dpi=100)
    plt.close(figure)
    return out


def _make_root(root: pathlib.Path) -> None:
    if root.exists() and not root.is_dir():
        raise errors.InvalidInput(f"--root {root}: not a directory")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise errors.InvalidInput(f"--root {root}: cannot create it: {exc.strerror or exc}") from exc


def run_file(path: pathlib.Path, *, root: pathlib.Path, chaos: bool = False, seed: int | None = None) -> int:
    """`trainingrun run`: 0 if the run succeeded, 1 if it failed; errors.InvalidInput for a file or root that
    cannot be used (the command line exits 2)."""
    run = runfile.load(path)
    _make_root(root)
    local = LocalRun(run, root, chaos=Chaos(random.Random(seed)) if chaos else None, files_dir=path.resolve().parent)
    local.adopt_old_layout()
    previous = _read_json(local.dir / "status.json") or {}
    if previous.get("phase") == Phase.SUCCEEDED.value:
        print(f"{run.metadata.name} already succeeded (see {local.dir / 'status.json'})", file=sys.stderr)
        return 0
    with _progress(local) as update:
        phase = local.supervise(update)
    status = local.status
    plot = plot_rewards(local.dir, status)
    latest = ((status.get("checkpoints") or {}).get("latest") or {}).get("step")
    spent = goodput.line(model.Goodput.model_validate(status["goodput"]) if status.get("goodput") else None)
    print(
        f"{run.metadata.name}: {phase.value} after {len(status.get('attempts') or [])} attempt(s), "
        f"newest checkpoint step {latest}" + (f", {spent}" if spent else "") + f"; status {local.dir / 'status.json'}"
        + (f", plot {plot}" if plot else ""),
        file=sys.stderr,
    )  # fmt: skip
    return 0 if phase is Phase.SUCCEEDED else 1
