"""The real Kueue on the test bed (hack/testbed/kueue.py, binaries.Kueue): where the pinned binary is found and what
is said when it is missing, its Configuration, and the private /etc it runs in. No binary runs."""

from __future__ import annotations

from pathlib import Path

import pytest

import binaries
import errors
import kueue


def test_kueue_is_found_in_its_own_directory_beside_the_pin_set(tmp_path: Path) -> None:
    version = binaries.read_env_file(binaries.PINS_FILE)["KUEUE_VERSION"]
    home = tmp_path / "bin" / f"kueue-{version}"
    module = tmp_path / "kueue-module"
    (module / "config" / "components" / "crd" / "bases").mkdir(parents=True)
    (module / "config" / "components" / "crd" / "bases" / "kueue.x-k8s.io_workloads.yaml").write_text("{}")
    home.mkdir(parents=True)
    (home / "kueue").write_text("")
    (home / "paths.env").write_text(f"KUEUE_MODULE_DIR={module}\n")
    found = binaries.Kueue.locate(tmp_path)
    assert found.binary == home / "kueue" and found.version == version
    assert [p.name for p in found.crd_paths] == ["kueue.x-k8s.io_workloads.yaml"]
    assert binaries.pin_set(binaries.read_env_file(binaries.PINS_FILE)) not in str(home), "not in the pin set's"


def test_a_missing_kueue_says_to_run_make_testbed(tmp_path: Path) -> None:
    with pytest.raises(errors.MissingBinaries, match=r"kueue, paths.env\. Run `make testbed`"):
        binaries.Kueue.locate(tmp_path)


def test_kueue_runs_the_rayjob_integration_only_without_leader_election_certificates_or_visibility_server() -> None:
    config = kueue.configuration(health_port=1, webhook_port=2, cert_dir=Path("/c"))
    assert config["integrations"] == {"frameworks": ["ray.io/rayjob"]}
    assert config["leaderElection"] == {"leaderElect": False}
    assert config["internalCertManagement"] == {"enable": False}
    assert config["manageJobsWithoutQueueName"] is False
    assert config["featureGates"] == {"VisibilityOnDemand": False}
    assert config["health"]["healthProbeBindAddress"] == "127.0.0.1:1"
    assert config["webhook"] == {"port": 2, "host": "127.0.0.1", "certDir": "/c"}
    assert config["metrics"] == {"bindAddress": "0"}


def test_kueue_gets_its_metrics_certificate_in_an_overlay_of_etc_in_a_private_mount_namespace() -> None:
    argv = kueue.in_private_etc(["/bin/kueue", "--config=/x y"], Path("/certs"), Path("/scratch"))
    assert argv[:4] == ["unshare", "--mount", "--propagation", "private"]
    script = argv[-1]
    assert "mount -t overlay overlay -o lowerdir=/etc,upperdir=/scratch/upper,workdir=/scratch/work /etc" in script
    assert "cp /certs/tls.crt /certs/tls.key /etc/kueue/metrics/certs/" in script
    assert script.endswith("exec /bin/kueue '--config=/x y'")
