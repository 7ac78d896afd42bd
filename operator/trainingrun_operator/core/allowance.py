"""The cluster admin's allow-list: the escalations a pod template fragment may have because the admin allows them
(`Allowance`), and the rules that refuse the rest (`ALLOWABLE`). Pure.

Real GPU clusters need two things that an unprivileged pod lacks: a capability added to a container (`IPC_LOCK`,
`SYS_RESOURCE` for RDMA) and a `hostPath` volume of a device directory (`/dev/infiniband`). The admin lists them
in the chart's values; the chart passes the same lists to both lines of defence:

    values.yaml   podSecurity.allow.capabilities, .hostPaths   (empty: nothing allowed, the default)
         │
         ├─► the ValidatingAdmissionPolicy <release>-trainingrun-pod-security, the lists written into its
         │     expressions (templates/pod-security-policy.yaml): refused at `kubectl apply`
         └─► the operator's --allow-capabilities, --allow-host-paths (cli.py: `parse`) ─► decision ─► validation
               ─► `podtemplate.problems(..., allow)`: the run fails as InvalidSpec, with the same words

Both rules stay out of the CRD (the CRD is the same in every cluster; the lists are the cluster's); every other
escalation (`podtemplate.ESCALATIONS`) is refused by the CRD whatever the admin allows. Local mode
(`trainingrun run`) has no chart and allows nothing. A host path is allowed at or under a listed directory,
component by component (`/dev/infiniband` allows `/dev/infiniband/uverbs0`, not `/dev/infinibandX`), never with a
`..` component. A pod that adds `IPC_LOCK` or has a hostPath volume passes Pod Security Admission's `privileged`
level only (docs/safety.md).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

__all__ = ["ALLOWABLE", "NONE", "AllowList", "Allowable", "Allowance", "parse"]

AllowList = Literal["capabilities", "hostPaths"]
"""A list of the chart's `podSecurity.allow` (the policy's variables that hold them have the same names)."""

_CAPABILITY = re.compile(r"[A-Z][A-Z0-9_]*")
_HOST_PATH = re.compile(r"(/[A-Za-z0-9._@+=:-]+)+")
_DOTS = re.compile(r"(^|/)\.\.?(/|$)")
"""An allowed capability, an allowed host path (no trailing `/`) and what it must not hold: the chart's own checks
(`_helpers.tpl`) are these."""


@dataclasses.dataclass(frozen=True)
class Allowance:
    """What the admin allows beyond an unprivileged pod (the chart's `podSecurity.allow`). Empty: nothing."""

    capabilities: frozenset[str] = frozenset()
    """Capabilities a container may add (`securityContext.capabilities.add`), as written there (`IPC_LOCK`)."""
    host_paths: tuple[str, ...] = ()
    """Directories a `hostPath` volume may be at or under; absolute, without a trailing `/`."""

    def allows(self, values: AllowList, value: Any) -> bool:
        if not isinstance(value, str):
            return False
        if values == "capabilities":
            return value in self.capabilities
        return ".." not in value.split("/") and any(value == p or value.startswith(p + "/") for p in self.host_paths)


NONE = Allowance()
"""Nothing allowed: the chart's default, and local mode's."""


def parse(capabilities: Iterable[str] = (), host_paths: Iterable[str] = ()) -> Allowance:
    """An Allowance from the chart's lists (empty entries skipped); ValueError naming the first entry that cannot
    be one: a capability is capital letters, digits and `_` (not `ALL`, which would allow every one); a host path
    is absolute, not `/` (the node's whole filesystem), its components letters, digits and `. _ @ + = : -`, none of
    them `.` or `..` (one trailing `/` is dropped): nothing that could end the policy's string literal. The chart
    refuses the same entries when it renders."""
    caps = [c.strip() for c in capabilities if c.strip()]
    for cap in caps:
        if not _CAPABILITY.fullmatch(cap) or cap == "ALL":
            raise ValueError(f"capability {cap!r}: a capability's name, e.g. IPC_LOCK (capital letters, not ALL)")
    given = [p.strip() for p in host_paths if p.strip()]
    for path in given:
        if not _HOST_PATH.fullmatch(path.removesuffix("/")) or _DOTS.search(path):
            raise ValueError(
                f"host path {path!r}: an absolute directory other than /, e.g. /dev/infiniband (letters, digits "
                "and . _ @ + = : - in each component; no . or .. component)"
            )
    return Allowance(frozenset(caps), tuple(p.removesuffix("/") for p in given))


@dataclasses.dataclass(frozen=True)
class Allowable:
    """An escalation the admin may allow: at `node` (each container of every `podtemplate.CONTAINER_LISTS` list,
    each volume), the value or the list of values at `path`, each one refused unless the allowance's list `values`
    has it, naming the field, the value, the chart's value to set and `why`. The chart's ValidatingAdmissionPolicy
    says the same words (templates/pod-security-policy.yaml)."""

    node: Literal["container", "volume"]
    path: tuple[str, ...]
    values: AllowList
    said: str
    why: str

    def message(self, value: str) -> str:
        return f"{value} {self.said} (podSecurity.allow.{self.values} in the chart's values): {self.why}"

    def refused(self, node: Mapping[str, Any], allow: Allowance) -> list[str]:
        """The values at `path` under `node` that `allow` does not allow, in their order."""
        value: Any = node
        for key in self.path:
            if not isinstance(value, Mapping) or value.get(key) is None:
                return []
            value = value[key]
        return [str(v) for v in (value if isinstance(value, list) else [value]) if not allow.allows(self.values, v)]


ALLOWABLE: tuple[Allowable, ...] = (
    Allowable(
        "container",
        ("securityContext", "capabilities", "add"),
        "capabilities",
        "is not in the cluster's allow-list",
        "remove it, or ask your cluster admin to allow it",
    ),
    Allowable(
        "volume",
        ("hostPath", "path"),
        "hostPaths",
        "is not at or under a path in the cluster's allow-list",
        "a Ray pod sees only the node's directories that the admin allows: use a persistentVolumeClaim, an emptyDir "
        "or a csi volume, or ask your cluster admin to allow it",
    ),
)
