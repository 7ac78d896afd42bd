"""A group's pod template: what the operator puts in it, the user's fragment merged in, and what the fragment may
not touch. Pure.

Who calls it: `rayjob.py` builds each group's pod template (`base`) and merges the user's fragment into it
(`merged`); `validation.py` lists what a fragment must not set (`problems`, given the admin's allowance);
`operator/sync_manifests.py` writes the same refusals (but the allowable ones) into the CRD as CEL rules
(`cel_rules`), so `kubectl apply` and `trainingrun run` say the same.

    spec.ray.head.template / spec.ray.workers[].template    (a PodTemplateSpec fragment, KubeRay's schema)
            │
            ▼   merged(base(...), fragment)
    the operator's template           the fragment adds
      metadata.labels run, attempt  ◄── labels and annotations (the operator's keys refused)
      containers[0] ray-head|ray-worker ◄── an entry of that name: env, envFrom, volumeMounts, securityContext,
        image, imagePullPolicy,             ports, probes... (image, command, args, resources, imagePullPolicy
        resources, mounts, preStop          and, on the head, lifecycle refused); other names: sidecars, after it
      volumes checkpoints, dev-shm  ◄── more volumes (those two names refused; no container mounts anything at
                                        /checkpoints or /dev/shm, a sidecar may mount `checkpoints` elsewhere)
      nodeSelector, tolerations     ◄── added to the group's own (a nodeSelector key given twice must agree)
      serviceAccountName (head)     ◄── anything else of a PodSpec: affinity, imagePullSecrets, priorityClassName,
      terminationGracePeriodSeconds     securityContext, initContainers, topologySpreadConstraints... (the head's
                                        ServiceAccount and every group's grace period refused)

Escalations (`ESCALATIONS`) are refused in every group, in every container of `containers`, `initContainers` and
`ephemeralContainers`, the pod's securityContext and the volumes: privileged, allowPrivilegeEscalation true,
runAsUser 0, runAsNonRoot false, host namespaces, a projected ServiceAccount token, and on workers a `*-driver`
ServiceAccount (another run's driver token patches that run's status). Added capabilities and hostPath volumes are
refused unless the cluster admin allows them (`allowance.ALLOWABLE`, the chart's `podSecurity.allow`; checked here
and by the chart's ValidatingAdmissionPolicy, not by the CRD). Mount paths at or under /checkpoints and /dev/shm are
refused in every container of those lists. Under the fragment's security contexts every pod and each of its
containers and init containers gets a restricted one (`RESTRICTED_POD`, `RESTRICTED_CONTAINER`: non-root,
RuntimeDefault seccomp, no privilege escalation, drop ALL), so a namespace whose Pod Security Admission level is
`restricted` runs Ray pods (unless the admin's allowance let a capability or a hostPath in: see `allowance.py`).

Merging: objects are merged key by key, lists are the operator's items then the fragment's, a value both give is
the operator's (the rules below refuse such a fragment first, so this never decides anything). Containers are
matched by name: the Ray container stays first (KubeRay runs Ray in `containers[0]`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, Literal

from trainingrun_operator.core import allowance, naming

__all__ = [
    "CHECKPOINT_MOUNT",
    "CHECKPOINT_VOLUME",
    "CONTAINER_HEAD",
    "CONTAINER_LISTS",
    "CONTAINER_WORKER",
    "ESCALATIONS",
    "RESTRICTED_CONTAINER",
    "RESTRICTED_POD",
    "RULES",
    "RUNTIME_UID",
    "SHM_MOUNT",
    "SHM_VOLUME",
    "Escalation",
    "Group",
    "Refusal",
    "Rule",
    "Where",
    "base",
    "cel_rules",
    "conflicts",
    "merged",
    "problems",
]

CHECKPOINT_MOUNT = "/checkpoints"
CHECKPOINT_VOLUME = "checkpoints"
SHM_MOUNT = "/dev/shm"
SHM_VOLUME = "dev-shm"
CONTAINER_HEAD = "ray-head"
CONTAINER_WORKER = "ray-worker"
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
"""The lists of a PodSpec whose containers the escalation and mount rules look at (the Ray container and the
sidecars are in the first)."""

Group = Literal["head", "worker"]
Node = Literal["labels", "pod", "ray-container", "volume", "mount", "container-name", "sidecar"]
"""Where a rule looks: a label key, a PodSpec key, a key of the Ray container, a volume's name, a container's
mount path, a container's name, a sidecar (a container that is not the Ray container)."""


def ray_container(group: Group) -> str:
    return CONTAINER_HEAD if group == "head" else CONTAINER_WORKER


@dataclasses.dataclass(frozen=True)
class Rule:
    """One thing a fragment may not do: at `node`, the key or value `name`, in the `groups` it applies to, and
    why (what to set instead), in words that both the CEL rule and the operator's own check print."""

    node: Node
    name: str
    why: str
    groups: tuple[Group, ...] = ("head", "worker")


_RUN_LABELS = tuple(naming.attempt_labels("run", 1))
RULES: tuple[Rule, ...] = (
    *(Rule("labels", key, "the operator labels every pod with its run, its attempt and itself") for key in _RUN_LABELS),
    Rule("pod", "serviceAccountName", "the head runs as the driver's per-run ServiceAccount <run>-driver", ("head",)),
    Rule("pod", "serviceAccount", "the head runs as the driver's per-run ServiceAccount <run>-driver", ("head",)),
    Rule(
        "pod",
        "automountServiceAccountToken",
        "the driver needs its ServiceAccount's token to report to the TrainingRun's status",
        ("head",),
    ),
    Rule(
        "pod",
        "automountServiceAccountToken",
        "worker pods get no API token (they never call the API server)",
        ("worker",),
    ),
    Rule(
        "pod",
        "terminationGracePeriodSeconds",
        "set spec.ray.head.terminationGracePeriodSeconds (the preStop hook's deadline comes from it)",
        ("head",),
    ),
    Rule("pod", "terminationGracePeriodSeconds", "set spec.ray.workers[].terminationGracePeriodSeconds", ("worker",)),
    Rule("ray-container", "image", "the Ray container runs spec.image"),
    Rule("ray-container", "imagePullPolicy", "set spec.imagePullPolicy"),
    Rule("ray-container", "command", "KubeRay starts Ray in the Ray container"),
    Rule("ray-container", "args", "KubeRay starts Ray in the Ray container"),
    Rule(
        "ray-container", "resources", "set spec.ray.head.resources (the head's Ray CPUs are checked there)", ("head",)
    ),
    Rule("ray-container", "resources", "set spec.ray.workers[].resources", ("worker",)),
    Rule(
        "ray-container",
        "lifecycle",
        "the head's preStop hook asks the driver to save a checkpoint on the pod's notice",
        ("head",),
    ),
    Rule("volume", CHECKPOINT_VOLUME, "the checkpoint volume is spec.checkpoint.pvc"),
    Rule("volume", SHM_VOLUME, "the Ray container's /dev/shm; set the group's shmSize"),
    Rule(
        "mount",
        CHECKPOINT_MOUNT,
        "the Ray container's checkpoint volume (a sidecar may mount the checkpoints volume elsewhere)",
    ),
    Rule("mount", SHM_MOUNT, "the Ray container's memory-backed /dev/shm; set the group's shmSize"),
    Rule("container-name", CONTAINER_WORKER, "the worker groups' Ray container; the head's is ray-head", ("head",)),
    Rule("container-name", CONTAINER_HEAD, "the head's Ray container; the worker groups' is ray-worker", ("worker",)),
    Rule("sidecar", "image", "a container not named as the Ray container is a sidecar and needs an image"),
)


def _message(rule: Rule, group: Group) -> str:
    ray = ray_container(group)
    what = {
        "labels": f"the label {rule.name} is set by the operator",
        "pod": f"{rule.name} is set by the operator",
        "ray-container": f"{rule.name} of the Ray container ({ray}) is set by the operator",
        "volume": f"the volume name {rule.name} is the operator's",
        "mount": f"the mount path {rule.name} and every path under it are the operator's",
        "container-name": f"the container name {rule.name} is the operator's",
        "sidecar": f"a sidecar needs an image (to change the Ray container, name the entry {ray})",
    }[rule.node]
    return what if rule.node == "sidecar" else f"{what}: {rule.why}"


Check = Literal["true", "false", "zero", "set", "driver", "unconfined"]
"""What makes a value an escalation: `true`, `false`, the number 0, being set at all, a name ending in `-driver`,
`Unconfined`."""
_SAID = {
    "true": ": true is refused",
    "false": ": false is refused",
    "zero": ": 0 (root) is refused",
    "set": " is refused",
    "driver": ": *-driver is refused",
    "unconfined": ": Unconfined is refused",
}


@dataclasses.dataclass(frozen=True)
class Escalation:
    """A value that would give a pod more than an unprivileged pod has: at `node` (the PodSpec, each container of
    every `CONTAINER_LISTS` list, each volume, each source of a projected volume), the field `path` under it,
    refused when `check` holds, with why and what to do instead."""

    node: Literal["pod", "container", "volume", "projection"]
    path: tuple[str, ...]
    check: Check
    why: str
    groups: tuple[Group, ...] = ("head", "worker")

    @property
    def message(self) -> str:
        return f"{'.'.join(self.path)}{_SAID[self.check]}: {self.why}"

    def breaks(self, node: Mapping[str, Any]) -> bool:
        value: Any = node
        for key in self.path:
            if not isinstance(value, Mapping) or value.get(key) is None:
                return False
            value = value[key]
        return {
            "true": value is True,
            "false": value is False,
            "zero": value == 0 and not isinstance(value, bool),
            "set": True,
            "driver": isinstance(value, str) and value.endswith("-driver"),
            "unconfined": isinstance(value, str) and value == "Unconfined",
        }[self.check]


_SECCOMP = "Ray pods run under the runtime's default seccomp profile (RuntimeDefault): remove it, or use Localhost"
_NON_ROOT = "Ray pods run as a non-root user (the runtime image's UID is 1000): remove it or give another UID"
_DRIVER = (
    "<run>-driver is a run's driver ServiceAccount, whose token patches that run's status: give the worker group "
    "a ServiceAccount of another name"
)
ESCALATIONS: tuple[Escalation, ...] = (
    Escalation("pod", ("hostNetwork",), "true", "a Ray pod does not join the node's network namespace: remove it"),
    Escalation("pod", ("hostPID",), "true", "a Ray pod does not join the node's process namespace: remove it"),
    Escalation("pod", ("hostIPC",), "true", "a Ray pod does not join the node's IPC namespace: remove it"),
    Escalation("pod", ("securityContext", "runAsUser"), "zero", _NON_ROOT),
    Escalation("pod", ("securityContext", "runAsNonRoot"), "false", "the operator sets runAsNonRoot: remove it"),
    Escalation("pod", ("securityContext", "seccompProfile", "type"), "unconfined", _SECCOMP),
    Escalation("pod", ("serviceAccountName",), "driver", _DRIVER, ("worker",)),
    Escalation("pod", ("serviceAccount",), "driver", _DRIVER, ("worker",)),
    Escalation("container", ("securityContext", "privileged"), "true", "containers run unprivileged: remove it"),
    Escalation(
        "container",
        ("securityContext", "allowPrivilegeEscalation"),
        "true",
        "no process of a Ray pod may gain privileges: remove it or set false",
    ),
    Escalation("container", ("securityContext", "runAsUser"), "zero", _NON_ROOT),
    Escalation("container", ("securityContext", "runAsNonRoot"), "false", "the pod runs as non-root: remove it"),
    Escalation("container", ("securityContext", "seccompProfile", "type"), "unconfined", _SECCOMP),
    Escalation(
        "projection",
        ("serviceAccountToken",),
        "set",
        "worker pods get no API token, and the head's is its driver's: remove the serviceAccountToken source",
    ),
)


# ----------------------------------------------------------------------------------------------- build


RAY_DRAIN_VARIABLE = "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"
"""Ray 2.60's `ray start --block` drains its node for this many seconds (default 30) on SIGTERM before it stops: a
deleted head would hold its pod, and with it the next attempt, for most of its grace period after the driver has
saved on the notice. Our pods serve no traffic to drain, so the operator sets 0 (a template's env may set it again:
the later entry wins)."""


RUNTIME_UID = 1000
"""The runtime image's user (`runtime/Dockerfile`: `USER 1000`). Set as the pod's runAsUser so that runAsNonRoot
holds without reading the image (an image whose USER is a name, or the test bed, cannot be checked otherwise); a
fragment may set another."""
RESTRICTED_POD: Mapping[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": RUNTIME_UID,
    "seccompProfile": {"type": "RuntimeDefault"},
}
RESTRICTED_CONTAINER: Mapping[str, Any] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
"""The security contexts every Ray pod and each of its containers and init containers get (Pod Security
Admission's `restricted` profile), under the fragment's: a fragment may add to them (more dropped capabilities, a
Localhost seccomp profile, another non-root UID, fsGroup) but not undo them (`ESCALATIONS` refuses that first).
KubeRay's own init container on workers (wait-gcs-ready) copies the Ray container's security context."""


def base(
    group: Group,
    image: str,
    image_pull_policy: str,
    labels: Mapping[str, str],
    resources: Mapping[str, Any],
    claim_name: str,
    shm_size: int | str | None,
) -> dict[str, Any]:
    """The operator's own pod template of a group: the Ray container (image, resources, no drain on SIGTERM, the
    checkpoint volume at /checkpoints, a memory-backed /dev/shm) and the pod's labels. `rayjob.py` adds the rest of
    what it owns."""
    shm: dict[str, Any] = {"medium": "Memory"}
    if shm_size is not None:
        shm["sizeLimit"] = shm_size
    ray = {
        "name": ray_container(group),
        "image": image,
        "imagePullPolicy": image_pull_policy,
        "resources": dict(resources),
        "env": [{"name": RAY_DRAIN_VARIABLE, "value": "0"}],
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


def merged(ours: Mapping[str, Any], fragment: Mapping[str, Any] | None) -> dict[str, Any]:
    """The pod template `ours` with the user's `fragment` merged in (the rules of the module docstring), over the
    restricted security contexts (`RESTRICTED_POD`, `RESTRICTED_CONTAINER`). Neither argument is changed."""
    theirs = dict(fragment or {})
    spec = dict(_mapping(theirs.get("spec")))
    containers = _items(spec.pop("containers", None))
    out = _merge_objects(ours, {**theirs, "spec": spec} if theirs else {})
    own: list[dict[str, Any]] = out["spec"]["containers"]
    for entry in containers:
        mine = next((i for i, c in enumerate(own) if c.get("name") == entry.get("name")), None)
        if mine is None:
            own.append(_merge_objects({}, entry))
        else:
            own[mine] = _merge_objects(own[mine], entry)
    pod = out["spec"]
    pod["securityContext"] = _merge_objects(_mapping(pod.get("securityContext")), RESTRICTED_POD)
    for kind in ("containers", "initContainers"):  # ephemeral containers are never in a created pod
        if isinstance(pod.get(kind), list):
            pod[kind] = [_restricted(c) if isinstance(c, Mapping) else c for c in pod[kind]]
    return out


def _restricted(container: Mapping[str, Any]) -> dict[str, Any]:
    """`container` with its security context over `RESTRICTED_CONTAINER`."""
    context = _merge_objects(_mapping(container.get("securityContext")), RESTRICTED_CONTAINER)
    return {**container, "securityContext": context}


def _merge_objects(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> dict[str, Any]:
    """Key by key; a key both give is merged (`_merge`), copies all the way down."""
    both = {k: _merge(v, theirs[k]) if k in theirs else _copy(v) for k, v in ours.items()}
    return both | {k: _copy(v) for k, v in theirs.items() if k not in ours}


def _merge(ours: Any, theirs: Any) -> Any:
    """Objects key by key, lists ours then theirs (a string or number once: `drop: [ALL]` given twice is one), and
    a value both give stays ours."""
    if isinstance(ours, Mapping) and isinstance(theirs, Mapping):
        return _merge_objects(ours, theirs)
    if isinstance(ours, list) and isinstance(theirs, list):
        new = [t for t in theirs if not (isinstance(t, (str, int, float)) and t in ours)]
        return [_copy(item) for item in (*ours, *new)]
    return _copy(ours)


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------- refuse


@dataclasses.dataclass(frozen=True)
class Refusal:
    """A fragment sets what the operator owns: where, relative to the fragment (`spec`, `containers`, 0, ...),
    and the rule's message."""

    loc: tuple[str | int, ...]
    message: str


def problems(
    fragment: Mapping[str, Any] | None, group: Group, allow: allowance.Allowance = allowance.NONE
) -> list[Refusal]:
    """Every rule of `RULES`, `ESCALATIONS` and `allowance.ALLOWABLE` that `fragment` breaks (the last ones unless
    `allow` has the value), in the fragment's order (labels, pod, volumes, containers)."""
    if not fragment:
        return []
    return list(_refusals(fragment, group, allow))


def _refusals(fragment: Mapping[str, Any], group: Group, allow: allowance.Allowance) -> Iterator[Refusal]:
    rules = [r for r in RULES if group in r.groups]
    escalations = [e for e in ESCALATIONS if group in e.groups]
    ray = ray_container(group)
    labels = _mapping(_mapping(fragment.get("metadata")).get("labels"))
    pod = _mapping(fragment.get("spec"))
    for rule in rules:
        if rule.node == "labels" and rule.name in labels:
            yield Refusal(("metadata", "labels"), _message(rule, group))
        if rule.node == "pod" and rule.name in pod:
            yield Refusal(("spec", rule.name), _message(rule, group))
    yield from _escalations(("spec",), pod, "pod", escalations)
    for index, volume in enumerate(_items(pod.get("volumes"))):
        at: tuple[str | int, ...] = ("spec", "volumes", index)
        for rule in rules:
            if rule.node == "volume" and volume.get("name") == rule.name:
                yield Refusal((*at, "name"), _message(rule, group))
        yield from _escalations(at, volume, "volume", escalations)
        yield from _not_allowed(at, volume, "volume", allow)
        for s, source in enumerate(_items(_mapping(volume.get("projected")).get("sources"))):
            yield from _escalations((*at, "projected", "sources", s), source, "projection", escalations)
    for kind in CONTAINER_LISTS:
        for index, container in enumerate(_items(pod.get(kind))):
            at = ("spec", kind, index)
            if kind == "containers":
                yield from _container_refusals(at, container, container.get("name") == ray, rules, group)
            yield from _escalations(at, container, "container", escalations)
            yield from _not_allowed(at, container, "container", allow)
            for m, mount in enumerate(_items(container.get("volumeMounts"))):
                for rule in rules:
                    if rule.node == "mount" and _at_or_under(mount.get("mountPath"), rule.name):
                        yield Refusal((*at, "volumeMounts", m, "mountPath"), _message(rule, group))


def _container_refusals(
    at: tuple[str | int, ...], container: Mapping[str, Any], is_ray: bool, rules: list[Rule], group: Group
) -> Iterator[Refusal]:
    """The rules of a `containers` entry: its name, a sidecar's image, what the Ray container may not set."""
    for rule in rules:
        if rule.node == "container-name" and container.get("name") == rule.name:
            yield Refusal((*at, "name"), _message(rule, group))
        elif rule.node == "sidecar" and not is_ray and rule.name not in container:
            yield Refusal((*at, rule.name), _message(rule, group))
        elif rule.node == "ray-container" and is_ray and rule.name in container:
            yield Refusal((*at, rule.name), _message(rule, group))


def _escalations(
    at: tuple[str | int, ...], node: Mapping[str, Any], where: str, escalations: list[Escalation]
) -> Iterator[Refusal]:
    for escalation in escalations:
        if escalation.node == where and escalation.breaks(node):
            yield Refusal((*at, *escalation.path), escalation.message)


def _not_allowed(
    at: tuple[str | int, ...], node: Mapping[str, Any], where: str, allow: allowance.Allowance
) -> Iterator[Refusal]:
    for allowable in allowance.ALLOWABLE:
        if allowable.node == where:
            for value in allowable.refused(node, allow):
                yield Refusal((*at, *allowable.path), allowable.message(value))


def _at_or_under(path: Any, owned: str) -> bool:
    """`path` is `owned` or below it (`/checkpoints`, `/checkpoints/`, `/checkpoints/x`; not `/checkpointsx`)."""
    return isinstance(path, str) and (path == owned or path.startswith(owned + "/"))


def conflicts(fragment: Mapping[str, Any] | None, node_selector: Mapping[str, str] | None) -> list[Refusal]:
    """What else the merged pod would get wrong, checked by the operator only (a CEL rule that walks every mount
    of every container costs more than the API server allows): a nodeSelector key the group gives another value,
    and a mount of a volume that neither the fragment nor the operator defines (which the Pod's own validation
    refuses only when KubeRay creates the pod)."""
    pod = _mapping(_mapping(fragment).get("spec"))
    found = []
    own = node_selector or {}
    for key, value in _mapping(pod.get("nodeSelector")).items():
        if key in own and own[key] != value:
            why = f"{key} is {own[key]!r} in the group's nodeSelector and {value!r} here"
            found.append(Refusal(("spec", "nodeSelector"), why))
    defined = {CHECKPOINT_VOLUME, SHM_VOLUME} | {v.get("name") for v in _items(pod.get("volumes"))}
    for c, container in enumerate(_items(pod.get("containers"))):
        for m, mount in enumerate(_items(container.get("volumeMounts"))):
            if mount.get("name") not in defined:
                why = f"no volume is named {mount.get('name')!r}: add it to the template's spec.volumes"
                found.append(Refusal(("spec", "containers", c, "volumeMounts", m, "name"), why))
    return found


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _items(value: Any) -> list[Mapping[str, Any]]:
    return [item for item in value if isinstance(item, Mapping)] if isinstance(value, list) else []


# ----------------------------------------------------------------------------------------- CEL (the CRD)

Where = Literal["metadata", "pod", "volume", "projection", "container", "any-container", "mount"]
"""The node of the pod template schema a CEL rule sits on: `template.metadata`, `template.spec`,
`template.spec.volumes[*]`, `template.spec.volumes[*].projected.sources[*]`, `template.spec.containers[*]`, every
container of the `CONTAINER_LISTS` lists (`any-container`) and each one's `volumeMounts[*]` (`mount`)."""


def cel_rules(group: Group) -> dict[Where, list[dict[str, str]]]:
    """The `x-kubernetes-validations` of each node of a group's template schema: the same `RULES` and
    `ESCALATIONS`, the same messages, each pointing at the field (`fieldPath`) so that the API server names it.
    `allowance.ALLOWABLE` is not here: what the admin allows is the cluster's, and the CRD is the same in every
    cluster (the chart's ValidatingAdmissionPolicy, rendered with the lists, checks those).
    Each rule looks at one node, never iterates a list: the API server's cost estimate refuses a rule that walks a
    container's mounts (the lists are unbounded), which is why a mount path is refused in every container, not
    only the Ray one."""
    out: dict[Where, list[dict[str, str]]] = {
        "metadata": [],
        "pod": [],
        "volume": [],
        "projection": [],
        "container": [],
        "any-container": [],
        "mount": [],
    }
    ray = ray_container(group)
    for rule in (r for r in RULES if group in r.groups):
        where: Where
        if rule.node == "labels":
            where, cel, path = "metadata", f"!has(self.labels) || !({_quoted(rule.name)} in self.labels)", ".labels"
        elif rule.node == "pod":
            where, cel, path = "pod", f"!has(self.{rule.name})", f".{rule.name}"
        elif rule.node == "volume":
            where, cel, path = "volume", f"self.name != {_quoted(rule.name)}", ".name"
        elif rule.node == "container-name":
            where, cel, path = "container", f"self.name != {_quoted(rule.name)}", ".name"
        elif rule.node == "sidecar":
            where, cel, path = "container", f"self.name == {_quoted(ray)} || has(self.{rule.name})", f".{rule.name}"
        elif rule.node == "ray-container":
            where, cel, path = "container", f"self.name != {_quoted(ray)} || !has(self.{rule.name})", f".{rule.name}"
        else:
            owned = _quoted(rule.name)
            cel = f"self.mountPath != {owned} && !self.mountPath.startsWith({_quoted(rule.name + '/')})"
            where, path = "mount", ".mountPath"
        out[where].append({"rule": cel, "message": _message(rule, group), "fieldPath": path})
    for escalation in (e for e in ESCALATIONS if group in e.groups):
        node: Where = "any-container" if escalation.node == "container" else escalation.node
        out[node].append(
            {
                "rule": _escalation_cel(escalation),
                "message": escalation.message,
                "fieldPath": "." + ".".join(escalation.path),
            }
        )
    return out


def _escalation_cel(escalation: Escalation) -> str:
    """`!has(self.a) || !has(self.a.b) || <the value of self.a.b is not an escalation>`."""
    fields = ["self." + ".".join(escalation.path[: i + 1]) for i in range(len(escalation.path))]
    absent = " || ".join(f"!has({f})" for f in fields)
    value = fields[-1]
    fine = {
        "true": f"{value} != true",
        "false": f"{value} != false",
        "zero": f"{value} != 0",
        "set": "",
        "driver": f"!{value}.endsWith('-driver')",
        "unconfined": f"{value} != 'Unconfined'",
    }[escalation.check]
    return f"{absent} || {fine}" if fine else absent


def _quoted(text: str) -> str:
    """A CEL string literal (the names here hold no quote or backslash)."""
    assert "'" not in text and "\\" not in text, text
    return f"'{text}'"
