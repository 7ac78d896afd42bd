"""The test bed's volume provisioner: a hostPath PersistentVolume, pre-bound by `claimRef`, for every pending PVC
(a pod that mounts an unbound PVC is never scheduled), and where a bound claim's data lives on this machine.

Each volume's directory is mode 0777, as Rancher's local-path-provisioner makes its hostPath directories: any user
of a pod may write it (the runtime image runs as UID 1000; a Ray pod as a local process runs as this user).

Who uses it: `podrunner.PodRunner`, once per pass (`provision`) and when it mounts a pod's claims
(`claim_directory`); tests read a claim's files through `PodRunner.claim_directory`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubeapi

log = logging.getLogger(__name__)

PROVISIONER_LABEL = "trainingrun.dev/testbed-provisioner"


class ClaimNotMountable(RuntimeError):
    """A PVC is not Bound to a hostPath PV, so a pod that mounts it cannot start (as a kubelet's mount failure)."""


def hostpath_volume(name: str, pvc: dict[str, Any], directory: Path) -> dict[str, Any]:
    """A PV for `pvc` at `directory`, bound to it by claimRef, with the claim's size, access modes and class."""
    meta, spec = pvc["metadata"], pvc["spec"]
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "labels": {PROVISIONER_LABEL: "podrunner"}},
        "spec": {
            "capacity": {"storage": (spec.get("resources", {}).get("requests") or {}).get("storage", "1Gi")},
            "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": spec.get("storageClassName") or "",
            "volumeMode": spec.get("volumeMode", "Filesystem"),
            "hostPath": {"path": str(directory), "type": "DirectoryOrCreate"},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
            },
        },
    }


@dataclass(eq=False)
class HostPathProvisioner:
    """Provisions under `root` (one directory per claim) through `api` (admin)."""

    api: kubeapi.KubeApi
    root: Path
    _provisioned: set[str] = field(init=False, default_factory=set)  # PV names

    def provision(self) -> list[str]:
        """One pass: a PV for each pending PVC, and the Released PVs it made deleted. Returns a line per PV made."""
        made = []
        for pvc in self.api.items("/api/v1/persistentvolumeclaims"):
            meta = pvc["metadata"]
            if pvc.get("status", {}).get("phase") != "Pending" or pvc["spec"].get("volumeName"):
                continue
            name = f"pv-{meta['namespace']}-{meta['name']}"[:200] + f"-{meta['uid'][:6]}"
            if name in self._provisioned:
                continue
            directory = self.root / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:6]}"
            directory.mkdir(parents=True, exist_ok=True)
            directory.chmod(0o777)
            volume = hostpath_volume(name, pvc, directory)
            status, answer = self.api.request("POST", "/api/v1/persistentvolumes", volume)
            if status in (201, 409):
                self._provisioned.add(name)
                made.append(f"pvc {meta['namespace']}/{meta['name']}: Provisioned {name} at {directory}")
            else:
                log.warning("creating PV %s returned %s: %s", name, status, answer)
        for pv in self.api.items(f"/api/v1/persistentvolumes?labelSelector={PROVISIONER_LABEL.replace('/', '%2F')}"):
            if pv.get("status", {}).get("phase") == "Released":
                self.api.request("DELETE", f"/api/v1/persistentvolumes/{pv['metadata']['name']}")
        return made

    def claim_directory(self, namespace: str, claim: str) -> Path:
        """Where PVC `namespace/claim`'s data lives on this machine (its PV's hostPath, created if missing)."""
        status, pvc = self.api.request("GET", f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")
        if status != 200 or pvc.get("status", {}).get("phase") != "Bound":
            raise ClaimNotMountable(f"PVC {namespace}/{claim} is not Bound ({status})")
        status, pv = self.api.request("GET", f"/api/v1/persistentvolumes/{pvc['spec']['volumeName']}")
        path = (pv.get("spec", {}).get("hostPath") or {}).get("path") if status == 200 else None
        if not path:
            raise ClaimNotMountable(f"PV {pvc['spec']['volumeName']} of PVC {namespace}/{claim} has no hostPath")
        Path(path).mkdir(parents=True, exist_ok=True)
        return Path(path)
