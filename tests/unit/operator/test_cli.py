"""The command line answers a newcomer's mistakes with one message and exit status 2, never a traceback.

Each mistake is made as a user would make it: a file that is missing, a directory, YAML that does not parse, a file
without a TrainingRun, invalid fields in spec and spec.trainer at once, a misspelt field, a run name that would put
the run's files outside --root; for `trainingrun operator`, a kubeconfig that is missing or broken, or none at all.
Nothing here starts Ray or reaches a cluster: every case stops before that.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest
import yaml

from trainingrun_operator import cli
from trainingrun_operator.localmode import local

EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / "manifests" / "examples" / "tiny.yaml"


def trainingrun(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """Run the command in-process; (exit status, stderr). Nothing may go to stdout."""
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert out == ""
    assert "Traceback" not in err
    return code, err


def example(tmp_path: pathlib.Path, edit: str = "", replace: str = "") -> pathlib.Path:
    """tiny.yaml, with one line (`edit`, as text) replaced by `replace`, written to tmp_path/run.yaml."""
    text = EXAMPLE.read_text()
    if edit:
        assert text.count(edit) == 1, edit
        text = text.replace(edit, replace)
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def line_of(path: pathlib.Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


# ------------------------------------------------------------------------------------------------ run


def test_a_missing_file_is_named(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    code, err = trainingrun(capsys, "run", str(tmp_path / "nope.yaml"), "--root", str(tmp_path))
    assert code == 2 and err == f"trainingrun run: error: {tmp_path / 'nope.yaml'}: no such file\n"


def test_a_directory_instead_of_a_file_is_named(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    code, err = trainingrun(capsys, "run", str(tmp_path), "--root", str(tmp_path))
    assert code == 2 and err == f"trainingrun run: error: {tmp_path}: is a directory; give a TrainingRun YAML file\n"


def test_a_yaml_syntax_error_names_its_line_and_column(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    path = example(tmp_path, "    seed: 0\n", "   seed: 0\n")  # one space short
    code, err = trainingrun(capsys, "run", str(path), "--root", str(tmp_path))
    line = line_of(path, "   seed: 0")
    assert code == 2 and err.startswith(f"trainingrun run: error: {path}:{line}:4: not valid YAML: ")
    assert err.count("\n") == 1, "one line"


@pytest.mark.parametrize(
    "text, found",
    [
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings}\n", "found: ConfigMap settings"),
        ("", "it is empty"),
        ("- one\n- two\n", "found: a list"),
    ],
)
def test_a_file_without_a_trainingrun_says_so_and_what_it_found(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path, text: str, found: str
) -> None:
    path = tmp_path / "other.yaml"
    path.write_text(text)
    code, err = trainingrun(capsys, "run", str(path), "--root", str(tmp_path))
    assert code == 2
    assert err == (
        f"trainingrun run: error: {path}: no TrainingRun in this file ({found}); "
        "a TrainingRun starts with `apiVersion: trainingrun.dev/v1alpha1` and `kind: TrainingRun`\n"
    )


def test_every_invalid_field_of_spec_and_trainer_is_reported_at_once_with_its_line(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    path = example(tmp_path)
    text = path.read_text().replace("steps: 120", "steps: -5").replace("groupSize: 4", "groupSize: 0")
    path.write_text(text.replace("savePeriod: 5", "savePeriod: 0"))
    code, err = trainingrun(capsys, "run", str(path), "--root", str(tmp_path))
    assert code == 2
    assert err.splitlines() == [
        f"trainingrun run: error: {path}: TrainingRun tiny has 3 invalid fields:",
        f"  {path}:{line_of(path, 'steps: -5')}:5: spec.trainer.steps: must be >= 1 (got -5)",
        f"  {path}:{line_of(path, 'groupSize: 0')}:12: spec.trainer.grpo.groupSize: must be >= 2 (got 0)",
        f"  {path}:{line_of(path, 'savePeriod: 0')}:5: spec.checkpoint.savePeriod: must be >= 1 (got 0)",
    ]
    assert not (tmp_path / "tiny").exists(), "nothing ran"


def test_an_unknown_field_is_named_with_the_nearest_known_one(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    path = example(tmp_path, "    logEvery: 2\n", "    logEvry: 2\n")
    code, err = trainingrun(capsys, "run", str(path), "--root", str(tmp_path))
    assert code == 2
    assert err.splitlines()[1:] == [
        f"  {path}:{line_of(path, 'logEvry')}:5: spec.trainer.logEvry: unknown field (did you mean logEvery?)"
    ]


def test_a_root_that_is_a_file_is_named(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    path = example(tmp_path)
    code, err = trainingrun(capsys, "run", str(path), "--root", str(path))
    assert code == 2 and err == f"trainingrun run: error: --root {path}: not a directory\n"


@pytest.mark.parametrize("name", ["../outside", "{tmp_path}/outside"])
def test_a_run_name_that_would_leave_the_root_is_refused_before_anything_is_written(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    def supervise(*args: object, **kwargs: object) -> None:
        pytest.fail("the run started")

    monkeypatch.setattr(local.LocalRun, "supervise", supervise)
    name = name.format(tmp_path=tmp_path)
    path = example(tmp_path, "  name: tiny\n", f"  name: {name}\n")
    root = tmp_path / "root"
    code, err = trainingrun(capsys, "run", str(path), "--root", str(root))
    assert code == 2
    assert err.splitlines()[1].startswith(f"  {path}:{line_of(path, name)}:3: metadata.name: must be a DNS-1035 label")
    assert sorted(tmp_path.rglob("*")) == [path], "nothing written, under the root or outside it"


def test_the_message_is_all_a_user_sees_and_debug_adds_the_traceback(tmp_path: pathlib.Path) -> None:
    """The installed command's own output, in a fresh process (logging as configured by the command)."""
    command = [sys.executable, "-m", "trainingrun_operator.cli", "run", str(tmp_path / "nope.yaml")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    plain = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert (plain.returncode, plain.stdout) == (2, "")
    assert plain.stderr == f"trainingrun run: error: {tmp_path / 'nope.yaml'}: no such file\n"
    debug = subprocess.run([*command, "--log-level", "DEBUG"], capture_output=True, text=True, env=env, timeout=120)
    assert debug.returncode == 2 and "Traceback" in debug.stderr and "FileNotFoundError" in debug.stderr
    assert debug.stderr.endswith(plain.stderr)


# ------------------------------------------------------------------------------------------- operator


def test_a_missing_kubeconfig_is_named(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    code, err = trainingrun(capsys, "operator", "--kubeconfig", str(tmp_path / "kubeconfig"))
    assert code == 2 and err == f"trainingrun operator: error: --kubeconfig {tmp_path / 'kubeconfig'}: no such file\n"


def test_a_kubeconfig_that_is_not_yaml_names_its_line(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text("apiVersion: v1\nkind: Config\nclusters: [\n")
    code, err = trainingrun(capsys, "operator", "--kubeconfig", str(path))
    assert code == 2 and err.startswith(f"trainingrun operator: error: {path}:4:1: not valid YAML: ")


def test_a_kubeconfig_without_the_context_asked_for_says_so(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "clusters": [], "contexts": [], "users": []}))
    code, err = trainingrun(capsys, "operator", "--kubeconfig", str(path), "--context", "prod")
    assert code == 2 and err.startswith(f"trainingrun operator: error: --kubeconfig {path}: ")
    assert "prod" in err and err.count("\n") == 1


def test_no_credentials_at_all_says_where_it_looked(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kubernetes.config.kube_config

    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    # The client reads KUBECONFIG once, when it is first imported.
    monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(tmp_path / "absent"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    code, err = trainingrun(capsys, "operator")
    assert code == 2
    assert err == (
        f"trainingrun operator: error: no Kubernetes credentials: not in a pod, and no kubeconfig at "
        f"KUBECONFIG={tmp_path / 'absent'}; pass --kubeconfig FILE or point KUBECONFIG at one\n"
    )


def test_the_charts_deployment_arguments_parse(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    """The chart passes `operator --log-level=...` (after the subcommand); the parser once rejected that."""
    rendered = EXAMPLE.parents[1] / "deploy" / "trainingrun-operator.yaml"
    (deployment,) = [d for d in yaml.safe_load_all(rendered.read_text()) if d and d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "--log-level=INFO" in container["args"]
    missing = tmp_path / "kubeconfig"
    code, err = trainingrun(capsys, *container["args"], "--kubeconfig", str(missing))
    assert code == 2 and err == f"trainingrun operator: error: --kubeconfig {missing}: no such file\n"


def test_a_metrics_address_without_a_port_is_named_before_anything_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, err = trainingrun(capsys, "operator", "--metrics-address", "0.0.0.0")
    assert code == 2
    assert err == (
        "trainingrun operator: error: --metrics-address: metrics address '0.0.0.0': expected HOST:PORT, "
        "e.g. 0.0.0.0:8081\n"
    )


def operator_settings(monkeypatch: pytest.MonkeyPatch, *argv: str) -> dict[str, Any]:
    """What `trainingrun operator ARGV` hands cli.operate (no cluster: the credentials and the operator are fakes)."""
    import kubernetes.client

    from trainingrun_operator.kube import apiclient

    handed: dict[str, Any] = {}

    async def operate(api: Any, **kwargs: Any) -> None:
        handed.update(kwargs)

    monkeypatch.setattr(apiclient, "load_configuration", lambda *_: kubernetes.client.Configuration())
    monkeypatch.setattr(cli, "operate", operate)
    assert cli.main(["operator", *argv]) == 0
    return handed


def test_the_network_policy_flags_become_the_sources_of_every_run_s_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainingrun_operator.core import netpolicy

    assert operator_settings(monkeypatch)["network"] == netpolicy.DEFAULT
    given = operator_settings(
        monkeypatch,
        "--kuberay-namespace=ray-system",
        "--kuberay-label=app=kuberay",
        "--kuberay-label=tier=operator",
        "--metrics-namespace=monitoring",
        "--metrics-namespace=obs",
    )
    assert given["network"] == netpolicy.Sources(
        kuberay_labels={"app": "kuberay", "tier": "operator"},
        kuberay_namespace="ray-system",
        metrics_namespaces=("monitoring", "obs"),
    )
    assert operator_settings(monkeypatch, "--no-network-policy")["network"] is None


def test_the_allow_list_flags_become_the_allowance_of_every_run_s_templates(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainingrun_operator.core import allowance

    assert operator_settings(monkeypatch)["allow"] == allowance.NONE
    given = operator_settings(monkeypatch, "--allow-capabilities=IPC_LOCK,SYS_RESOURCE", "--allow-host-paths=/dev/x/")
    assert given["allow"] == allowance.Allowance(frozenset({"IPC_LOCK", "SYS_RESOURCE"}), ("/dev/x",))
    assert operator_settings(monkeypatch, "--allow-capabilities=", "--allow-host-paths=")["allow"] == allowance.NONE


@pytest.mark.parametrize(
    ("flag", "says"),
    [
        ("--allow-host-paths=/", "--allow-host-paths: host path '/': an absolute directory other than /"),
        ("--allow-capabilities=IPC_LOCK,ALL", "--allow-capabilities: capability 'ALL': a capability's name"),
    ],
)
def test_an_allow_list_flag_entry_that_cannot_be_one_is_named_before_anything_starts(
    capsys: pytest.CaptureFixture[str], flag: str, says: str
) -> None:
    code, err = trainingrun(capsys, "operator", flag)
    assert code == 2 and err.startswith(f"trainingrun operator: error: {says}"), err


@pytest.mark.parametrize("label", ["app", "=kuberay"])
def test_a_kuberay_label_that_is_not_key_equals_value_is_named_before_anything_starts(
    capsys: pytest.CaptureFixture[str], label: str
) -> None:
    code, err = trainingrun(capsys, "operator", f"--kuberay-label={label}")
    assert code == 2
    assert err == (
        f"trainingrun operator: error: --kuberay-label {label}: expected KEY=VALUE, "
        "e.g. app.kubernetes.io/name=kuberay-operator\n"
    )


def test_export_runs_the_runtimes_exporter_and_passes_on_its_exit_status(tmp_path: pathlib.Path) -> None:
    """The operator's command never imports the runtime: `export` runs it as a process and returns its status."""
    fixture = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "bundle-format-1" / "compat"
    done = subprocess.run(
        [sys.executable, "-m", "trainingrun_operator.cli", "export", str(tmp_path / "none"), str(tmp_path / "a")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and "holds no complete checkpoint" in done.stderr
    assert cli.main(["export", str(fixture), str(tmp_path / "b"), "--step", "2"]) == 0
    assert (tmp_path / "b" / "config.json").is_file() and (tmp_path / "b" / "model.safetensors").is_file()
