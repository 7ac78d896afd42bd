"""The plumbing every test-bed component runs on (hack/testbed/components.py): free ports, log tails, stopping a
process group, children that die with their parent, and the exit handlers. Real processes (sleep, sh, python);
no binary of the test bed, no cluster."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import components
from support import waiting

HERE = Path(components.__file__).resolve().parent


def gone(pid: int) -> bool:
    """The process has exited (a zombie not yet reaped by whoever adopted it counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def pid_in(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):  # not written yet, or half written
        return None


def spawn(tmp_path: Path, script: str) -> components.Process:
    """`sh -c script` in its own process group, as ControlPlane.spawn starts a component."""
    log_path = tmp_path / "sh.log"
    with open(log_path, "ab") as log_file:
        popen = subprocess.Popen(
            ["sh", "-c", script], stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_path
        )
    return components.Process(name="sh", popen=popen, log_path=log_path)


def test_a_free_port_can_be_bound_on_loopback() -> None:
    port = components.free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))


def test_a_pods_ports_are_distinct_free_and_never_ones_the_kernel_hands_out_on_its_own() -> None:
    low, _ = components.ephemeral_range()
    ports = components.pod_ports(4)
    assert len(set(ports)) == 4
    assert all(components.RAY_WORKER_PORTS_END <= p < low and components.bindable(p) for p in ports), (ports, low)


def test_a_port_someone_listens_on_is_not_bindable() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert not components.bindable(s.getsockname()[1])


def test_a_pods_ports_come_from_free_port_when_the_ephemeral_range_leaves_no_room() -> None:
    ports = components.pod_ports(2, ephemeral=(20500, 60999))
    assert len(set(ports)) == 2 and all(components.bindable(p) for p in ports)


def test_the_ephemeral_range_is_read_from_the_kernel_or_defaults(tmp_path: Path) -> None:
    (tmp_path / "range").write_text("40000\t50000\n")
    assert components.ephemeral_range(tmp_path / "range") == (40000, 50000)
    assert components.ephemeral_range(tmp_path / "missing") == (32768, 60999)


def test_tail_gives_the_last_lines_or_says_there_is_no_log(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(30)))
    assert components.tail(log, 2) == "line 28\nline 29"
    assert components.tail(tmp_path / "absent.log") == "(no log)"


def test_stop_ends_the_whole_process_group_and_marks_it_stopped(tmp_path: Path) -> None:
    process = spawn(tmp_path, "sleep 60 & echo $! > child.pid; wait")
    child = waiting.wait(lambda: pid_in(tmp_path / "child.pid"), timeout=10, what="child.pid written")
    assert process.alive() and not process.stopped
    process.stop()
    assert not process.alive() and process.stopped
    waiting.wait(lambda: gone(child), timeout=10, what="the group's other member gone")


def test_stop_kills_a_process_that_ignores_sigterm_after_the_timeout(tmp_path: Path) -> None:
    process = spawn(tmp_path, "trap '' TERM; echo trapped; while :; do sleep 1; done")
    waiting.wait(lambda: "trapped" in process.log_tail(), timeout=10, what="the TERM trap set")
    process.stop(timeout=0.2)
    assert process.popen.returncode == -signal.SIGKILL
    assert process.log_tail() == "trapped"


def test_stop_of_a_process_that_already_exited_only_marks_it_stopped(tmp_path: Path) -> None:
    process = spawn(tmp_path, "exit 3")
    process.popen.wait(10)
    process.stop()
    assert process.stopped and process.popen.returncode == 3


def run_python(code: str) -> subprocess.Popen[str]:
    """A Python with this directory's `components` imported, running `code`; stdin and stdout are pipes."""
    prelude = f"import sys; sys.path.insert(0, {str(HERE)!r}); import components\n"
    return subprocess.Popen(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_a_child_dies_with_its_parent_even_when_the_parent_is_killed_outright() -> None:
    parent = run_python(
        """
        import subprocess
        child = subprocess.Popen(["sleep", "60"], preexec_fn=components.die_with_parent())
        print(child.pid, flush=True)
        sys.stdin.read()
        """
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert not gone(child)
    parent.kill()
    parent.wait(10)
    waiting.wait(lambda: gone(child), timeout=10, what="the child killed by PR_SET_PDEATHSIG")


OWNER = """
class Owner:
    def stop(self):
        print("stopped", flush=True)

owner = Owner()
components.stop_on_exit(owner)
"""


def test_an_owner_is_stopped_at_interpreter_exit_unless_it_was_forgotten() -> None:
    exiting = run_python(OWNER)
    assert exiting.communicate(timeout=30)[0] == "stopped\n"
    forgotten = run_python(OWNER + "components.forget(owner)\n")
    assert forgotten.communicate(timeout=30)[0] == ""


def test_sigterm_stops_the_owner_then_ends_the_process_by_that_signal() -> None:
    terminated = run_python(OWNER + "print('ready', flush=True)\nsys.stdin.read()\n")
    assert terminated.stdout is not None
    assert terminated.stdout.readline() == "ready\n"
    terminated.send_signal(signal.SIGTERM)
    assert terminated.communicate(timeout=30)[0] == "stopped\n"
    assert terminated.returncode == -signal.SIGTERM
