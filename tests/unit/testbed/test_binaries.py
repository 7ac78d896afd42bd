"""Finding the test bed's pinned binaries (hack/testbed/binaries.py): the env-file format, the pin-set name that
build.sh also derives, and what `Binaries.locate` says when something is missing. A fake cache in tmp_path; no
binary runs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import binaries
import errors

PINS = {
    "K8S_VERSION": "v1.2.3",
    "ETCD_VERSION": "v3.4.5",
    "KWOK_VERSION": "v0.6.7",
    "KUBERAY_VERSION": "v1.8.9",
    "HELM_VERSION": "v3.10.11",
}


def fake_cache(
    tmp_path: Path, *, kuberay_crds: bool = True, skip: str | None = None, operator_version: str | None = None
) -> Path:
    """A cache with this checkout's pin set: every binary an empty file, paths.env naming a KubeRay module; prometheus
    in its own directory, its paths.env naming the Prometheus Operator's module (of `operator_version`)."""
    pins = binaries.read_env_file(binaries.PINS_FILE)
    cache = tmp_path / "cache"
    bin_dir = cache / "bin" / binaries.pin_set(pins)
    bin_dir.mkdir(parents=True)
    module = tmp_path / "kuberay"
    if kuberay_crds:
        (module / "config" / "crd" / "bases").mkdir(parents=True)
    for name in (*binaries.BINARY_NAMES, "paths.env"):
        if name != skip:
            (bin_dir / name).touch()
    if skip != "paths.env":
        (bin_dir / "paths.env").write_text(f"# written by build.sh\nKUBERAY_MODULE_DIR={module}\n")
    prom_dir = binaries.prometheus_dir(cache, pins)
    prom_dir.mkdir(parents=True)
    if skip != "prometheus":
        (prom_dir / "prometheus").touch()
    operator = tmp_path / f"prometheus-operator@{operator_version or pins['PROMETHEUS_OPERATOR_VERSION']}"
    (operator / binaries.PROMETHEUS_OPERATOR_CRDS).mkdir(parents=True)
    (operator / binaries.PROMETHEUS_OPERATOR_CRDS / binaries.SERVICE_MONITOR_CRD).touch()
    (prom_dir / "paths.env").write_text(f"PROMETHEUS_OPERATOR_MODULE_DIR={operator}\n")
    return cache


def test_env_files_ignore_comments_and_blank_lines_and_strip_around_the_equals(tmp_path: Path) -> None:
    env = tmp_path / "pins.env"
    env.write_text("# a comment\n\n  A = 1 \nB=x=y\nnot a pair\n")
    assert binaries.read_env_file(env) == {"A": "1", "B": "x=y"}


def test_the_pin_set_name_is_the_one_build_sh_derives() -> None:
    line = next(raw for raw in (binaries.HERE / "build.sh").read_text().splitlines() if raw.startswith("PIN_SET="))
    script = f'source {binaries.PINS_FILE}; {line}; printf %s "$PIN_SET"'
    derived = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    assert derived == binaries.pin_set(binaries.read_env_file(binaries.PINS_FILE))
    assert binaries.pin_set(PINS) == "k8s-v1.2.3_etcd-v3.4.5_kwok-v0.6.7_kuberay-v1.8.9_helm-v3.10.11"


def test_locate_finds_the_pin_set_and_the_kuberay_module(tmp_path: Path) -> None:
    found = binaries.Binaries.locate(fake_cache(tmp_path))
    assert found.path("kubectl") == found.bin_dir / "kubectl"
    assert found.kuberay_module_dir == tmp_path / "kuberay"
    assert found.versions == binaries.read_env_file(binaries.PINS_FILE)
    assert (
        found.path("prometheus")
        == found.prometheus
        == binaries.prometheus_dir(tmp_path / "cache", found.versions) / "prometheus"
    )
    assert found.service_monitor_crd.is_file()


def test_prometheus_has_a_directory_named_by_its_pin_as_build_sh_names_it() -> None:
    line = next(
        raw for raw in (binaries.HERE / "build.sh").read_text().splitlines() if raw.startswith("PROMETHEUS_BIN=")
    )
    script = f'source {binaries.PINS_FILE}; CACHE=/c; {line}; printf %s "$PROMETHEUS_BIN"'
    derived = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    assert derived == str(binaries.prometheus_dir(Path("/c"), binaries.read_env_file(binaries.PINS_FILE)))


def test_a_prometheus_operator_module_of_another_pin_is_missing_binaries(tmp_path: Path) -> None:
    with pytest.raises(errors.MissingBinaries, match=r"Prometheus Operator module .* not found"):
        binaries.Binaries.locate(fake_cache(tmp_path, operator_version="v0.1.0"))


def test_the_cache_comes_from_testbed_cache_when_it_is_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESTBED_CACHE", str(tmp_path))
    assert binaries.default_cache() == tmp_path
    monkeypatch.delenv("TESTBED_CACHE")
    assert binaries.default_cache() == Path.home() / ".cache" / "trainingrun"


@pytest.mark.parametrize("skip", ["kube-apiserver", "paths.env", "prometheus"])
def test_a_missing_binary_is_named_and_the_message_says_to_run_make_testbed(tmp_path: Path, skip: str) -> None:
    with pytest.raises(errors.MissingBinaries, match=rf"missing in .*: {skip}\. Run `make testbed`"):
        binaries.Binaries.locate(fake_cache(tmp_path, skip=skip))


def test_a_cleaned_module_cache_is_missing_binaries_too(tmp_path: Path) -> None:
    with pytest.raises(errors.MissingBinaries, match="KubeRay module not found"):
        binaries.Binaries.locate(fake_cache(tmp_path, kuberay_crds=False))


def test_missing_binaries_is_a_testbed_error() -> None:
    assert issubclass(errors.MissingBinaries, errors.TestbedError)


def test_the_crds_are_ours_then_kuberays_three(tmp_path: Path) -> None:
    found = binaries.Binaries.locate(fake_cache(tmp_path))
    paths = binaries.default_crd_paths(found)
    ours = sorted((binaries.REPO_ROOT / "manifests" / "crd").glob("*.yaml"))
    assert ours and paths[: len(ours)] == ours
    assert [p.name for p in paths[len(ours) :]] == list(binaries.KUBERAY_CRDS)
    assert all(p.parent == found.kuberay_module_dir / "config" / "crd" / "bases" for p in paths[len(ours) :])
