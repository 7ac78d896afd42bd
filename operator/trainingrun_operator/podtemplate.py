"""A group's pod template as the operator makes it: the Ray container with its image, resources, the checkpoint
volume and a memory-backed /dev/shm, and the pod's labels. Pure.

Who calls it: `rayjob.py` builds each group's pod template from `base` and adds the rest of what it owns (the
scheduling fields, the identity and, on the head, the preStop hook).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

__all__ = [
    "CHECKPOINT_MOUNT",
    "CHECKPOINT_VOLUME",
    "CONTAINER_HEAD",
    "CONTAINER_WORKER",
    "SHM_MOUNT",
    "SHM_VOLUME",
    "Group",
    "base",
]

CHECKPOINT_MOUNT = "/checkpoints"
CHECKPOINT_VOLUME = "checkpoints"
SHM_MOUNT = "/dev/shm"
SHM_VOLUME = "dev-shm"
CONTAINER_HEAD = "ray-head"
CONTAINER_WORKER = "ray-worker"

Group = Literal["head", "worker"]


def ray_container(group: Group) -> str:
    return CONTAINER_HEAD if group == "head" else CONTAINER_WORKER


# ----------------------------------------------------------------------------------------------- build


def base(
    group: Group,
    image: str,
    image_pull_policy: str,
    labels: Mapping[str, str],
    resources: Mapping[str, Any],
    claim_name: str,
    shm_size: int | str | None,
) -> dict[str, Any]:
    """The operator's own pod template of a group: the Ray container (image, resources, the checkpoint volume at
    /checkpoints, a memory-backed /dev/shm) and the pod's labels. `rayjob.py` adds the rest of what it owns."""
    shm: dict[str, Any] = {"medium": "Memory"}
    if shm_size is not None:
        shm["sizeLimit"] = shm_size
    ray = {
        "name": ray_container(group),
        "image": image,
        "imagePullPolicy": image_pull_policy,
        "resources": dict(resources),
        "volumeMounts": [
            {"name": CHECKPOINT_VOLUME, "mountPath": CHECKPOINT_MOUNT},
            {"name": SHM_VOLUME, "mountPath": SHM_MOUNT},
        ],
    }
    return {
        "metadata": {"labels": dict(labels)},
        "spec": {
            "containers": [ray],
            "volumes": [
                {"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": claim_name}},
                {"name": SHM_VOLUME, "emptyDir": shm},
            ],
        },
    }
