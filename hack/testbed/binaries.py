"""Where the test bed's pinned binaries are: this checkout's pin set (pins.env) in the build cache, and the files
the control plane applies from outside the binaries (our CRDs, KubeRay's from its Go module).

Who uses it: `controlplane.ControlPlane` (every component it spawns, kubectl, the CRDs), `tests/conftest.py` and
the `up` commands (`Binaries.locate()`, which says what to build when something is missing).

    pins.env ──> pin_set(pins) ──> <cache>/bin/<pin set>/{etcd, kube-apiserver, ..., paths.env}
             │                                             └── KUBERAY_MODULE_DIR (config/crd/bases, config/rbac)
             └─> PROMETHEUS_VERSION ──> <cache>/bin/prometheus-<version>/{prometheus, paths.env}
                                                           └── PROMETHEUS_OPERATOR_MODULE_DIR (its CRDs)

`hack/testbed/build.sh` (`make testbed`) builds them and writes paths.env; this module only finds them. Standard
library only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import errors  # this directory is on sys.path: as a script, and in pytest through pyproject's `pythonpath`

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
PINS_FILE = HERE / "pins.env"
BINARY_NAMES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "kuberay-operator",
    "helm",
)
KUBERAY_CRDS = ("ray.io_rayclusters.yaml", "ray.io_rayjobs.yaml", "ray.io_rayservices.yaml")
PROMETHEUS_OPERATOR_CRDS = Path("example") / "prometheus-operator-crd"
SERVICE_MONITOR_CRD = "monitoring.coreos.com_servicemonitors.yaml"
PROMETHEUS_RULE_CRD = "monitoring.coreos.com_prometheusrules.yaml"


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines, `#` comments and blank lines ignored (the format of pins.env and paths.env)."""
    values: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def pin_set(pins: dict[str, str]) -> str:
    """The cache directory name for one set of pins; build.sh derives the same name."""
    return (
        f"k8s-{pins['K8S_VERSION']}_etcd-{pins['ETCD_VERSION']}_kwok-{pins['KWOK_VERSION']}"
        f"_kuberay-{pins['KUBERAY_VERSION']}_helm-{pins['HELM_VERSION']}"
    )


def prometheus_dir(cache: Path, pins: dict[str, str]) -> Path:
    """Where prometheus is built: a directory named by its pin alone (build.sh derives the same name)."""
    return cache / "bin" / f"prometheus-{pins['PROMETHEUS_VERSION']}"


def default_cache() -> Path:
    return Path(os.environ.get("TESTBED_CACHE") or Path.home() / ".cache" / "trainingrun")


@dataclass(frozen=True)
class Binaries:
    """Where the built binaries and the KubeRay module (CRDs in config/crd/bases, RBAC in config/rbac) are; prometheus
    and the Prometheus Operator's module (its CRDs) beside them."""

    bin_dir: Path
    kuberay_module_dir: Path
    versions: dict[str, str]
    prometheus: Path
    prometheus_operator_module_dir: Path

    def path(self, name: str) -> Path:
        return self.prometheus if name == "prometheus" else self.bin_dir / name

    @property
    def service_monitor_crd(self) -> Path:
        return self.prometheus_operator_module_dir / PROMETHEUS_OPERATOR_CRDS / SERVICE_MONITOR_CRD

    @property
    def prometheus_rule_crd(self) -> Path:
        return self.prometheus_operator_module_dir / PROMETHEUS_OPERATOR_CRDS / PROMETHEUS_RULE_CRD

    @classmethod
    def locate(cls, cache: Path | None = None) -> Binaries:
        """Finds this checkout's pin set in the cache, or raises MissingBinaries saying what to run."""
        pins = read_env_file(PINS_FILE)
        cache = cache or default_cache()
        bin_dir = cache / "bin" / pin_set(pins)
        prom_dir = prometheus_dir(cache, pins)
        wanted = [bin_dir / n for n in (*BINARY_NAMES, "paths.env")] + [prom_dir / "prometheus", prom_dir / "paths.env"]
        missing = [p for p in wanted if not p.is_file()]
        if missing:
            where = sorted({str(p.parent) for p in missing})
            raise errors.MissingBinaries(
                f"test-bed binaries missing in {', '.join(where)}: {', '.join(p.name for p in missing)}. "
                "Run `make testbed` (or `bash hack/testbed/build.sh`; 15-20 min on a cold cache, 2 cores)."
            )
        paths = read_env_file(bin_dir / "paths.env")
        kuberay = Path(paths["KUBERAY_MODULE_DIR"])
        if not (kuberay / "config" / "crd" / "bases").is_dir():
            raise errors.MissingBinaries(
                f"KubeRay module not found at {kuberay} (module cache cleaned?). Run `make testbed`."
            )
        promop = Path(read_env_file(prom_dir / "paths.env").get("PROMETHEUS_OPERATOR_MODULE_DIR", ""))
        if (
            not promop.name.endswith(f"@{pins['PROMETHEUS_OPERATOR_VERSION']}")
            or not (promop / PROMETHEUS_OPERATOR_CRDS / SERVICE_MONITOR_CRD).is_file()
        ):
            raise errors.MissingBinaries(
                f"the Prometheus Operator module {pins['PROMETHEUS_OPERATOR_VERSION']} not found (at {promop}). "
                "Run `make testbed`."
            )
        return cls(
            bin_dir=bin_dir,
            kuberay_module_dir=kuberay,
            versions=pins,
            prometheus=prom_dir / "prometheus",
            prometheus_operator_module_dir=promop,
        )


@dataclass(frozen=True)
class Kueue:
    """The Kueue controller `make testbed` built (its own directory, `kueue-<KUEUE_VERSION>`, beside the pin set's)
    and its module (CRDs in config/components/crd/bases)."""

    binary: Path
    module_dir: Path
    version: str

    @property
    def crd_paths(self) -> list[Path]:
        return sorted((self.module_dir / "config" / "components" / "crd" / "bases").glob("*.yaml"))

    @classmethod
    def locate(cls, cache: Path | None = None) -> Kueue:
        """Finds the pinned Kueue in the cache, or raises MissingBinaries saying what to run."""
        version = read_env_file(PINS_FILE)["KUEUE_VERSION"]
        directory = (cache or default_cache()) / "bin" / f"kueue-{version}"
        missing = [n for n in ("kueue", "paths.env") if not (directory / n).is_file()]
        if missing:
            raise errors.MissingBinaries(
                f"Kueue {version} missing in {directory}: {', '.join(missing)}. "
                "Run `make testbed` (or `bash hack/testbed/build.sh`; about 7 min for Kueue on a cold cache)."
            )
        module = Path(read_env_file(directory / "paths.env")["KUEUE_MODULE_DIR"])
        if not (module / "config" / "components" / "crd" / "bases").is_dir():
            raise errors.MissingBinaries(
                f"Kueue module not found at {module} (module cache cleaned?). Run `make testbed`."
            )
        return cls(binary=directory / "kueue", module_dir=module, version=version)


def default_crd_paths(binaries: Binaries) -> list[Path]:
    """Ours (every YAML in manifests/crd/) and KubeRay's three CRDs from its module."""
    ours = sorted((REPO_ROOT / "manifests" / "crd").glob("*.yaml"))
    bases = binaries.kuberay_module_dir / "config" / "crd" / "bases"
    return [*ours, *(bases / name for name in KUBERAY_CRDS)]
