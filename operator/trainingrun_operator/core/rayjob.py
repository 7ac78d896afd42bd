"""The RayJob of one attempt, built as a plain dict. Pure: no I/O; `apiclient.py` sends what this returns.

Called by `handlers.py` when the decision core asks for `CreateAttempt`. The shape (KubeRay v1.5.0, ray.io/v1):

    RayJob <run>-a<N>   owner: the TrainingRun; labels: run, attempt (and a queued run's Kueue labels, `queueing.py`)
      spec.suspend               true for a queued run: Kueue unsuspends it when it admits it (as its webhook would)
      spec.entrypoint            python -m trainingrun_runtime --run ... --attempt N --resume <step|latest> ...
                                 --root /checkpoints/<path>/<namespace> --legacy-root /checkpoints/<path>
                                 --run-uid UID [--fallback S,S (older recorded steps, if the pinned one is bad)]
                                 or, with spec.driver: env TRAININGRUN_ATTACH=<the same facts as JSON> NAME=VALUE...
                                 <spec.driver.entrypoint...> (`program_entrypoint`; the program attaches through
                                 `trainingrun_runtime.sdk`)
      spec.submissionMode        HTTPMode (KubeRay submits to the head's dashboard; no submitter pod)
      spec.backoffLimit          0       (retries are ours: a new attempt, a new RayJob)
      spec.shutdownAfterJobFinishes true (the Ray cluster goes when the driver exits)
      spec.rayClusterSpec
        headGroupSpec            one pod, the per-run ServiceAccount (the driver patches status.runtime); it runs
                                 the driver and everything that holds run state (pinned there by the driver);
                                 terminationGracePeriodSeconds from the spec, and a preStop hook that asks the
                                 driver to save and stop within it (`trainingrun_runtime.sdk.notice`)
        workerGroupSpecs[]       replicas fixed (min = max = replicas), no API token mounted; rayStartParams
                                 resources += {"trainingrun_generation": 1000}: only generation workers ask for it
        every pod                the checkpoint PVC at /checkpoints, a memory-backed /dev/shm (sizeLimit: the
                                 group's shmSize), labels run + attempt; then the group's `template` fragment
                                 merged in (`podtemplate.py`: what it may add, what the operator owns)

tests/unit/operator/test_rayjob.py validates the output against KubeRay v1.5.0's real RayJob CRD schema.
"""

from __future__ import annotations

import json
import posixpath
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from trainingrun_operator.core import model, naming, podtemplate, queueing, validation
from trainingrun_runtime import contract
from trainingrun_runtime.config import GENERATION_RESOURCE, TRAINER_RESOURCE

__all__ = [
    "CHECKPOINT_MOUNT",
    "CONTAINER_HEAD",
    "CONTAINER_WORKER",
    "GENERATION_SLOTS",
    "attachment",
    "build_rayjob",
    "checkpoint_root",
    "entrypoint",
    "legacy_checkpoint_root",
    "notice_hook",
    "program_entrypoint",
]

CHECKPOINT_MOUNT = podtemplate.CHECKPOINT_MOUNT
CONTAINER_HEAD = podtemplate.CONTAINER_HEAD
CONTAINER_WORKER = podtemplate.CONTAINER_WORKER
RAYJOB_API_VERSION = "ray.io/v1"
GENERATION_SLOTS = 1000
"""Units of the generation resource every worker pod's Ray offers. A generation worker asks for one: the resource
marks where generation may run, it does not limit how many workers a pod takes (its CPUs and memory do)."""


def legacy_checkpoint_root(spec: model.TrainingRunSpec) -> str:
    """The driver's `--legacy-root`: the PVC's mount point joined with spec.checkpoint.path, the root of the
    layout before the namespace level, whose `<run>` directory the driver adopts if the run owns it."""
    path = spec.checkpoint.path
    return posixpath.join(CHECKPOINT_MOUNT, path) if path else CHECKPOINT_MOUNT


def checkpoint_root(spec: model.TrainingRunSpec, namespace: str) -> str:
    """The driver's `--root`: `<mount>/<spec.checkpoint.path>/<namespace>`, so that runs of one name in two
    namespaces never share a run directory on one volume."""
    if not namespace or "/" in namespace or namespace in (".", ".."):
        raise ValueError(f"namespace {namespace!r} is not a single path component")
    return posixpath.join(legacy_checkpoint_root(spec), namespace)


def entrypoint(
    run: str,
    namespace: str,
    attempt: int,
    resume: int | None,
    spec: model.TrainingRunSpec,
    uid: str | None = None,
    fallback: Sequence[int] = (),
    manifest_blake3: Mapping[int, str] | None = None,
) -> str:
    """The driver command line, every argument shell-quoted (the config JSON comes from the user).

    With `uid` (the TrainingRun's), the driver claims the run directory as (uid, attempt): a driver of an
    ended attempt that lives on stops writing there (`trainingrun_runtime.fence`).
    """
    config = validation.runtime_config(spec).model_dump(mode="json", by_alias=True)
    argv = [
        "python",
        "-m",
        "trainingrun_runtime",
        "--run",
        run,
        "--namespace",
        namespace,
        "--attempt",
        str(attempt),
        "--resume",
        "latest" if resume is None else str(resume),
        "--root",
        checkpoint_root(spec, namespace),
        "--legacy-root",
        legacy_checkpoint_root(spec),
        "--config-json",
        json.dumps(config, sort_keys=True, separators=(",", ":")),
        "--reporter",
        "kubernetes",
    ]
    if uid is not None:
        argv += ["--run-uid", uid]
    if resume is not None and fallback:
        argv += ["--fallback", ",".join(str(s) for s in fallback)]
    if resume is not None and manifest_blake3:
        argv += ["--manifest-blake3", manifest_hashes_arg(manifest_blake3)]
    return shlex.join(argv)


def attachment(
    run: str,
    namespace: str,
    attempt: int,
    resume: int | None,
    spec: model.TrainingRunSpec,
    *,
    root: str,
    reporter: str,
    uid: str | None,
    fallback: Sequence[int] = (),
    manifest_blake3: Mapping[int, str] | None = None,
) -> contract.Attachment:
    """What a spec.driver program is told of its attempt (`contract.ATTACH_ENV`): the built-in driver's arguments."""
    pinned = resume is not None
    return contract.Attachment(
        run=run,
        namespace=namespace,
        attempt=attempt,
        runUid=uid,
        root=root,
        resume=resume,
        fallback=sorted(fallback, reverse=True) if pinned else [],
        manifestBlake3={str(s): h for s, h in sorted((manifest_blake3 or {}).items())} if pinned else {},
        reporter=reporter,
        savePeriod=spec.checkpoint.save_period,
        keepLast=spec.checkpoint.retention.keep_last,
        keepEvery=spec.checkpoint.retention.keep_every,
        trainer=dict(spec.trainer),
    )


def program_entrypoint(driver: model.DriverSpec, attached: contract.Attachment) -> str:
    """The RayJob's entrypoint for a spec.driver program: `env`, the attachment and spec.driver.env, then the
    program's command; every word shell-quoted (all of it comes from the user)."""
    assignments = [f"{contract.ATTACH_ENV}={json.dumps(attached, sort_keys=True, separators=(',', ':'))}"]
    assignments += [f"{e.name}={e.value}" for e in driver.env or []]
    return shlex.join(["env", *assignments, *driver.entrypoint])


def manifest_hashes_arg(manifest_blake3: Mapping[int, str]) -> str:
    """The driver's `--manifest-blake3` value: STEP=HEX pairs, by step."""
    return ",".join(f"{step}={digest}" for step, digest in sorted(manifest_blake3.items()))


def owner_reference(run: str, uid: str) -> dict[str, Any]:
    """The TrainingRun as controlling owner: deleting the run deletes its RayJobs (not the PVC)."""
    return {
        "apiVersion": model.API_VERSION,
        "kind": model.KIND,
        "name": run,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _resources(resources: model.Resources | None) -> dict[str, Any]:
    return resources.wire() if resources is not None else {}


def _worker_start_params(group: model.WorkerGroup) -> dict[str, str]:
    """The group's `ray start` parameters with its role's resource merged into its `resources` JSON (the generation
    resource, or one unit of the trainer resource: one rank a pod), written as KubeRay writes that parameter itself
    (single-quoted JSON). The spec was checked (`validation.spec_problem`)."""
    params = dict(group.ray_start_params or {})
    role = {GENERATION_RESOURCE: GENERATION_SLOTS} if group.role == "generation" else {TRAINER_RESOURCE: 1}
    offered = {**validation.offered_resources(params), **role}
    params["resources"] = "'" + json.dumps(offered, sort_keys=True, separators=(",", ":")) + "'"
    return params


def notice_hook(run: str, namespace: str, attempt: int, spec: model.TrainingRunSpec) -> list[str]:
    """The head container's preStop command: ask the driver to save and stop within the grace period (the same
    `--root` as the driver's)."""
    return [
        "python",
        "-m",
        "trainingrun_runtime.sdk.notice",
        "--root",
        checkpoint_root(spec, namespace),
        "--run",
        run,
        "--attempt",
        str(attempt),
        "--grace-seconds",
        str(spec.ray.head.termination_grace_period_seconds),
    ]


def _pod_template(
    spec: model.TrainingRunSpec,
    labels: dict[str, str],
    group: model.RayGroup | model.WorkerGroup,
    service_account: str | None,
    pre_stop: list[str] | None = None,
) -> dict[str, Any]:
    """The group's pod template: the operator's (`podtemplate.base` plus the group's scheduling fields, the
    identity and, on the head, the preStop hook) with the group's `template` fragment merged in."""
    kind: podtemplate.Group = "head" if isinstance(group, model.RayGroup) else "worker"
    template = podtemplate.base(
        kind,
        spec.image,
        spec.image_pull_policy,
        labels,
        _resources(group.resources),
        spec.checkpoint.pvc.claim_name,
        group.shm_size,
    )
    pod = template["spec"]
    if pre_stop is not None:
        pod["containers"][0]["lifecycle"] = {"preStop": {"exec": {"command": pre_stop}}}
    if group.termination_grace_period_seconds is not None:
        pod["terminationGracePeriodSeconds"] = group.termination_grace_period_seconds
    if service_account is not None:
        pod["serviceAccountName"] = service_account
    else:
        pod["automountServiceAccountToken"] = False  # workers never talk to the API server
    if group.node_selector:
        pod["nodeSelector"] = dict(group.node_selector)
    if group.tolerations:
        pod["tolerations"] = [t.wire() for t in group.tolerations]
    return podtemplate.merged(template, group.template)


def build_rayjob(
    run: str,
    namespace: str,
    uid: str,
    attempt: int,
    resume: int | None,
    spec: model.TrainingRunSpec,
    fallback: Sequence[int] = (),
    queue: queueing.Queue | None = None,
    *,
    manifest_blake3: Mapping[int, str] | None = None,
) -> dict[str, Any]:
    """The RayJob for attempt `attempt` of TrainingRun `run` (uid `uid`), resuming from `resume` (or, if that
    fails verification, the newest of `fallback` that verifies); with a `queue`, created suspended in it (the
    queue's labels on the RayJob only, not on its pods)."""
    labels = naming.attempt_labels(run, attempt)
    head = spec.ray.head
    head_params = {"dashboard-host": "0.0.0.0", **(head.ray_start_params or {})}
    cluster: dict[str, Any] = {
        "rayVersion": spec.ray.ray_version,
        "headGroupSpec": {
            "rayStartParams": head_params,
            "template": _pod_template(
                spec, labels, head, naming.identity_name(run), notice_hook(run, namespace, attempt, spec)
            ),
        },
    }
    workers = [
        {
            "groupName": group.name,
            "replicas": group.replicas,
            "minReplicas": group.replicas,
            "maxReplicas": group.replicas,
            "rayStartParams": _worker_start_params(group),
            "template": _pod_template(spec, labels, group, None),
        }
        for group in spec.ray.workers or []
    ]
    if workers:
        cluster["workerGroupSpecs"] = workers
    if spec.driver is not None:
        attached = attachment(
            run, namespace, attempt, resume, spec, root=checkpoint_root(spec, namespace), reporter="kubernetes",
            uid=uid, fallback=fallback, manifest_blake3=manifest_blake3,
        )  # fmt: skip
        command = program_entrypoint(spec.driver, attached)
    else:
        command = entrypoint(run, namespace, attempt, resume, spec, uid, fallback, manifest_blake3)
    job_spec: dict[str, Any] = {
        "entrypoint": command,
        "submissionMode": "HTTPMode",
        "backoffLimit": 0,
        "shutdownAfterJobFinishes": True,  # also one of Kueue's rules for a RayJob it manages
        "rayClusterSpec": cluster,
    }
    if queue is not None:
        job_spec["suspend"] = True
    return {
        "apiVersion": RAYJOB_API_VERSION,
        "kind": "RayJob",
        "metadata": {
            "name": naming.rayjob_name(run, attempt),
            "namespace": namespace,
            "labels": {**labels, **queueing.rayjob_labels(queue)},
            "ownerReferences": [owner_reference(run, uid)],
        },
        "spec": job_spec,
    }
