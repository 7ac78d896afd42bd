"""What is wrong with a TrainingRun, field by field. Pure.

Called by the reconciler (an object that does not parse), the decision core (`spec_problem`: the checks the API
server cannot do at admission), the RayJob builder (`runtime_config`, the driver's `--config-json`;
`offered_resources`) and `trainingrun run` (`run_problems`: every invalid field of a TrainingRun file at once, the
model's and RuntimeConfig's).

This is the second line. The first is the API server: the CRD's schema bounds every field, `spec.trainer`
included (generated from the same RuntimeConfig: `crdschema.py`), so `kubectl apply` refuses most of what is here
before the operator sees it. The checks here still run on every pass: `trainingrun run` has no API server, a
TrainingRun admitted under an older CRD may not pass the newer one, and pydantic's models (the `model.py` mirror of
the CRD, RuntimeConfig) are laxer than the API server in one way: how a scalar is written (`"7"` or `true` for 7, 1).

What `spec_problem` checks, beyond what the CRD's schema already did:
- `spec.trainer` against the runtime's own RuntimeConfig, once more;
- `rayStartParams`: KubeRay writes each as `--<key>=<value>` into the pod's `ray start` shell command line, unquoted,
  so a key must be a flag name and a value plain text to the shell (`model.RAY_FLAG_PATTERN`, `RAY_VALUE_PATTERN`:
  the CRD's CEL rules say the same); `resources`, which the RayJob builder extends with the generation resource on
  a worker group, must be a JSON object of numbers with safe names (`RAY_RESOURCE_PATTERN`), which CEL cannot parse;
- placement: the head must host the run state (`HEAD_STATE_CPUS` logical CPUs: `rayStartParams.num-cpus`, else what
  KubeRay derives from the CPU limit, else from the request);
- pod templates: what the operator owns and what would escalate (privileged, host namespaces, root, a projected
  ServiceAccount token, a `*-driver` ServiceAccount: `podtemplate.problems`, the same rules the CRD's CEL rules
  apply, so that `trainingrun run` says what `kubectl apply` says; added capabilities and hostPath volumes unless
  the cluster admin's allowance has them, as the chart's ValidatingAdmissionPolicy says: `allowance.py`), a
  nodeSelector key that the group and its template give different values, and a mount of a volume that no one
  defines (the Pod's own validation, which would otherwise fail only when KubeRay creates the pod).
  The operator is given the allowance by the chart (its flags); `trainingrun run` allows nothing
  (`allowance.NONE`).
These are not CEL rules: CEL cannot parse JSON, and repeating KubeRay's num-cpus derivation (quantities that are
integers or strings, rounded up) in CEL would be a second copy of it that `trainingrun run` (no API server) would
not run. Here the decision core fails the run (Failed/InvalidSpec, the field and the fix in the message) before
any RayJob exists, and `trainingrun run` lists the same problems.

A problem names its field by its full path (`spec.trainer.grpo.lr`). It carries two texts: pydantic's message,
which the operator's Failed condition shows (`str(problem)`), and `explained`, what a person at a terminal
needs: the rule and the value given (`must be >= 1 (got -5)`), or for an unknown field the nearest known name.

`trainingrun_runtime.config` imports only pydantic, so importing it here keeps the operator free of torch and
ray.
"""

from __future__ import annotations

import dataclasses
import decimal
import difflib
import json
import math
import re
import types
import typing
from collections.abc import Mapping
from typing import Any

import pydantic
import pydantic_core

from trainingrun_operator.core import allowance, model, podtemplate
from trainingrun_runtime.config import GENERATION_RESOURCE, TRAINER_RESOURCE, RuntimeConfig

__all__ = [
    "HEAD_STATE_CPUS",
    "Problem",
    "offered_resources",
    "on_worker_groups",
    "problems",
    "run_problems",
    "runtime_config",
    "spec_problem",
    "trainer_pods",
]

HEAD_STATE_CPUS = 3
"""Logical CPUs the run state takes on the head: TransferQueue's controller and its two storage units, one each
(`trainingrun_runtime.driver.trainers.STORAGE_UNITS`; the controller actor, the trainer and the generation workers
ask for none)."""

Loc = tuple[str | int, ...]
_BOUNDS = {
    "greater_than_equal": (">=", "ge"),
    "greater_than": (">", "gt"),
    "less_than_equal": ("<=", "le"),
    "less_than": ("<", "lt"),
}


@dataclasses.dataclass(frozen=True)
class Problem:
    """One invalid field: where it is from the object's root (`loc`), pydantic's words, and the rule explained."""

    loc: Loc
    message: str
    explained: str = ""

    @property
    def path(self) -> str:
        return ".".join(str(part) for part in self.loc)

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def problems(
    error: pydantic.ValidationError, prefix: Loc = (), root: type[pydantic.BaseModel] | None = None
) -> list[Problem]:
    """Every field `error` rejects, in pydantic's order, each located under `prefix`. `root`: the model that
    was validated, to name the fields allowed where an unknown one was found."""
    return [Problem((*prefix, *detail["loc"]), detail["msg"], _explain(detail, root)) for detail in error.errors()]


def on_worker_groups(spec: model.TrainingRunSpec) -> bool:
    """The Ray cluster has generation pods (a worker group of role generation with replicas > 0): generation runs
    only there."""
    return any(group.replicas > 0 and group.role == "generation" for group in spec.ray.workers or [])


def trainer_pods(spec: model.TrainingRunSpec) -> int:
    """The pods of the worker groups of role trainer: the trainer ranks run there, one a pod (0: on the head)."""
    return sum(group.replicas for group in spec.ray.workers or [] if group.role == "trainer")


def runtime_config(spec: model.TrainingRunSpec, *, local: bool = False) -> RuntimeConfig:
    """The driver's `--config-json` value: spec.trainer verbatim, the checkpoint settings, and where generation runs.

    `local`: the run's Ray is one local node (the local backend), so generation runs beside the driver whatever
    spec.ray.workers says (no node there offers the generation resource).
    """
    return RuntimeConfig.model_validate(
        {
            "trainer": spec.trainer,
            "checkpoint": {
                "savePeriod": spec.checkpoint.save_period,
                "keepLast": spec.checkpoint.retention.keep_last,
                "keepEvery": spec.checkpoint.retention.keep_every,
            },
            "generation": {
                "onWorkerGroups": on_worker_groups(spec) and not local,
                "replacementSeconds": spec.restart_policy.worker_replacement_seconds,
            },
            "trainers": {"onWorkerGroups": trainer_pods(spec) > 0 and not local},
        }
    )


def _in_spec(loc: Loc) -> Loc:
    """A RuntimeConfig location as a spec path: the retention settings sit under `checkpoint.retention`, the
    replacement bound is `restartPolicy.workerReplacementSeconds`."""
    if loc[:1] == ("checkpoint",) and loc[1:2] in (("keepLast",), ("keepEvery",)):
        return ("spec", "checkpoint", "retention", *loc[1:])
    if loc[:2] == ("generation", "replacementSeconds"):
        return ("spec", "restartPolicy", "workerReplacementSeconds")
    return ("spec", *loc)


def _spec_problems(spec: model.TrainingRunSpec, allow: allowance.Allowance) -> list[Problem]:
    """Every problem of spec.trainer (and the checkpoint settings) against the runtime's RuntimeConfig, then every
    problem of the Ray cluster's placement and of its pod templates (given what the admin allows)."""
    try:
        runtime_config(spec)
    except pydantic.ValidationError as exc:
        found = [dataclasses.replace(p, loc=_in_spec(p.loc)) for p in problems(exc, root=RuntimeConfig)]
    else:
        found = []
    return found + _placement_problems(spec) + _template_problems(spec, allow)


# ------------------------------------------------------------------------------------------ placement

_QUANTITY = re.compile(r"^(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?P<suffix>[a-zA-Z]*|[eE][+-]?[0-9]+)$")
_SUFFIXES = {
    **{s: decimal.Decimal(10) ** e for s, e in (("n", -9), ("u", -6), ("m", -3), ("", 0), ("k", 3), ("M", 6))},
    **{s: decimal.Decimal(10) ** e for s, e in (("G", 9), ("T", 12), ("P", 15), ("E", 18))},
    **{s: decimal.Decimal(2) ** (10 * (i + 1)) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
}


def _cpus(quantity: model.Quantity) -> int:
    """A CPU quantity as KubeRay turns it into num-cpus (`Quantity.Value()`: rounded up); ValueError if invalid."""
    found = _QUANTITY.match(str(quantity).strip())
    if found is None:
        raise ValueError(quantity)
    suffix = found["suffix"]
    scale = decimal.Decimal(10) ** int(suffix[1:]) if suffix[:1] in ("e", "E") else _SUFFIXES.get(suffix)
    if scale is None:
        raise ValueError(quantity)
    return math.ceil(decimal.Decimal(found["number"]) * scale)


def _head_problem(head: model.RayGroup) -> Problem | None:
    """Whether the head's Ray can host the run state, with its logical CPUs counted as KubeRay 1.5 starts it
    (`generateRayStartCommand`): `rayStartParams.num-cpus`, else the CPU limit, else the CPU request (rounded up,
    as `Quantity.Value()`). None set: Ray counts the container's cores, which nothing here can know."""
    params = head.ray_start_params or {}
    loc: Loc = ("spec", "ray", "head", "rayStartParams", "num-cpus")
    if "num-cpus" in params:
        try:
            cpus = int(params["num-cpus"].strip())
        except ValueError:
            why = f"must be a whole number of logical CPUs (got {_shown(params['num-cpus'])})"
            return Problem(loc, why, why)
    else:
        resources = head.resources or model.Resources()
        for kind, amounts in (("limits", resources.limits), ("requests", resources.requests)):
            if not amounts or "cpu" not in amounts:
                continue
            loc = ("spec", "ray", "head", "resources", kind, "cpu")
            try:
                cpus = _cpus(amounts["cpu"])
            except ValueError:
                why = f"must be a Kubernetes quantity (got {_shown(amounts['cpu'])})"
                return Problem(loc, why, why)
            if cpus > 0:
                break
        else:
            return None
    if cpus >= HEAD_STATE_CPUS:
        return None
    why = (
        f"the head's Ray gets {cpus} logical CPU{'' if cpus == 1 else 's'} from this, but the run state it hosts "
        f"(TransferQueue's controller and storage units) needs {HEAD_STATE_CPUS}: set "
        f'spec.ray.head.rayStartParams.num-cpus to "{HEAD_STATE_CPUS}" or more (logical slots, not cores)'
    )
    return Problem(loc, why, why)


MAX_RAY_RESOURCE = 10**12
"""The largest amount of one custom resource in `rayStartParams.resources` (Ray keeps amounts as fixed point in an
int64, to 1e-4)."""


def offered_resources(params: Mapping[str, str] | None) -> dict[str, float]:
    """The custom resources a `rayStartParams` offers: its `resources` value as KubeRay reads it (surrounding
    quotes and spaces trimmed, a JSON object of numbers); ValueError saying what is wrong if it is not one of safe
    names (`model.RAY_RESOURCE_PATTERN`), amounts from 0 to MAX_RAY_RESOURCE, written only with the characters
    `model.RAY_RESOURCE_CHARS` (the value reaches the pod's shell command line as written)."""
    text = (params or {}).get("resources")
    if text is None:
        return {}
    if not re.fullmatch(model.RAY_RESOURCE_CHARS, text):
        raise ValueError("a character the shell would read: only letters, digits, spaces and _ . : , { } \" ' + -")
    try:
        value = json.loads(text.strip("'\"` "))
    except json.JSONDecodeError:
        raise ValueError("not JSON") from None
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    for name, amount in value.items():
        if not re.fullmatch(model.RAY_RESOURCE_PATTERN, name):
            raise ValueError(
                f"resource name {_shown(name)}: letters, digits and _ . : - only, starting with a letter, digit or _, "
                "at most 128 characters"
            )
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not 0 <= amount <= MAX_RAY_RESOURCE:
            raise ValueError(f"resource {name}: the amount must be a number from 0 to {MAX_RAY_RESOURCE:.0e}")
    return value


def _start_param_problems(at: Loc, params: Mapping[str, str] | None) -> list[Problem]:
    """Each `rayStartParams` key and value that is not plain text to a shell: KubeRay writes `--<key>=<value>` into
    the pod's `ray start` command line unquoted. `resources` is checked as the JSON it is (`_resources_problem`)."""
    found = []
    for key, value in (params or {}).items():
        loc = (*at, "rayStartParams", key)
        if len(key) > 63 or not re.fullmatch(model.RAY_FLAG_PATTERN, key):
            why = (
                "not a ray start flag name: a key is the flag without its leading -- (lowercase letters, digits and "
                f"'-', e.g. num-cpus), at most 63 characters (got {_shown(key)})"
            )
            found.append(Problem(loc, why, why))
        elif key != "resources" and not re.fullmatch(model.RAY_VALUE_PATTERN, value):
            why = (
                "reaches ray start's shell command line unquoted: write it with letters, digits and . _ : / = + , @ % "
                f"- only, no space, quote or shell metacharacter (got {_shown(value)})"
            )
            found.append(Problem(loc, why, why))
    return found


def _resources_problem(at: Loc, params: Mapping[str, str] | None, whose: str) -> Problem | None:
    """A `rayStartParams.resources` that KubeRay cannot read, or that is not safe on the shell's command line."""
    try:
        offered_resources(params)
    except ValueError as exc:
        given = (params or {})["resources"]
        why = (
            f"must be a JSON object of numbers, as KubeRay reads it ({whose}), single-quoted, e.g. "
            f"'{{\"my_resource\": 1}}': {exc} (got {_shown(given)})"
        )
        return Problem((*at, "rayStartParams", "resources"), why, why)
    return None


def _placement_problems(spec: model.TrainingRunSpec) -> list[Problem]:
    """Every group's `rayStartParams` must be safe on the shell's command line; the head must hold the run state
    (the built-in driver's: a spec.driver program places its own); a worker group's `resources` must be one the
    builder can extend."""
    at: Loc = ("spec", "ray", "head")
    found = _start_param_problems(at, spec.ray.head.ray_start_params)
    resources = _resources_problem(at, spec.ray.head.ray_start_params, "the head")
    found += [resources] if resources is not None else []
    unsafe_cpus = any(p.loc == (*at, "rayStartParams", "num-cpus") for p in found)
    builtin = spec.driver is None
    head = None if unsafe_cpus or not builtin else _head_problem(spec.ray.head)  # one problem for one num-cpus
    found += [head] if head is not None else []
    for index, group in enumerate(spec.ray.workers or []):
        at = ("spec", "ray", "workers", index)
        found += _start_param_problems(at, group.ray_start_params)
        added = GENERATION_RESOURCE if group.role == "generation" else TRAINER_RESOURCE
        whose = f"worker group {group.name}; the operator adds {added} to it"
        resources = _resources_problem(at, group.ray_start_params, whose)
        found += [resources] if resources is not None else []
    return found + (_trainer_pods_problems(spec) if builtin else [])


def _trainer_pods_problems(spec: model.TrainingRunSpec) -> list[Problem]:
    """Worker groups of role trainer hold one rank a pod: as many pods as spec.trainer.trainerWorkers at least."""
    pods = trainer_pods(spec)
    if not any(group.role == "trainer" for group in spec.ray.workers or []):
        return []
    try:
        ranks = runtime_config(spec).trainer.trainer_workers
    except pydantic.ValidationError:  # spec.trainer's own problems are reported on their own
        return []
    if pods >= ranks:
        return []
    why = (
        f"{ranks} trainer ranks (spec.trainer.trainerWorkers) need as many pods in the worker groups of role "
        f"trainer, one rank a pod; they have {pods}: raise their replicas, or lower trainerWorkers"
    )
    return [Problem(("spec", "trainer", "trainerWorkers"), why, why)]


# ------------------------------------------------------------------------------------------ pod templates


def _template_problems(spec: model.TrainingRunSpec, allow: allowance.Allowance) -> list[Problem]:
    """What each group's `template` must not say (see the module docstring), but what `allow` allows."""
    groups: list[tuple[Loc, podtemplate.Group, model.RayGroup | model.WorkerGroup]] = [
        (("spec", "ray", "head"), "head", spec.ray.head)
    ]
    groups += [(("spec", "ray", "workers", i), "worker", g) for i, g in enumerate(spec.ray.workers or [])]
    found = []
    for at, kind, group in groups:
        refused = podtemplate.problems(group.template, kind, allow) + podtemplate.conflicts(
            group.template, group.node_selector
        )
        found += [Problem((*at, "template", *r.loc), r.message, r.message) for r in refused]
    return found


def spec_problem(spec: model.TrainingRunSpec, allow: allowance.Allowance = allowance.NONE) -> str | None:
    """None if the spec can run, else 'spec.<field path>: <problem>' for the first problem found. `allow`: what the
    cluster admin allows in the pod templates (the operator's flags; nothing by default)."""
    found = _spec_problems(spec, allow)
    return str(found[0]) if found else None


def run_problems(obj: Mapping[str, Any], allow: allowance.Allowance = allowance.NONE) -> list[Problem]:
    """Every invalid field of a TrainingRun object, at once: the model (the CRD's mirror) and spec.trainer against
    RuntimeConfig, as the operator checks them (with `allow`; `trainingrun run` allows nothing). A spec the model
    rejects still has its trainer checked."""
    try:
        run = model.TrainingRun.model_validate(obj)
    except pydantic.ValidationError as exc:
        found = problems(exc, root=model.TrainingRun)
        spec = obj.get("spec")
        trainer = spec.get("trainer") if isinstance(spec, Mapping) else None
        if isinstance(trainer, Mapping):
            try:
                RuntimeConfig.model_validate({"trainer": trainer})
            except pydantic.ValidationError as trainer_exc:
                found += problems(trainer_exc, ("spec",), root=RuntimeConfig)
        return found
    return _spec_problems(run.spec, allow)


# -------------------------------------------------------------------------------- for a person to read


def _explain(detail: pydantic_core.ErrorDetails, root: type[pydantic.BaseModel] | None) -> str:
    """The rule a value broke, with the value given: `must be >= 1 (got -5)`."""
    kind, ctx, given = detail["type"], detail.get("ctx") or {}, detail.get("input")
    if kind == "missing":
        return "required, but missing"
    if kind == "extra_forbidden":
        return _unknown_field(detail["loc"], root)
    if kind == "value_error":
        return str(ctx.get("error", detail["msg"]))  # the model's own sentence
    if kind in _BOUNDS:
        sign, bound = _BOUNDS[kind]
        return f"must be {sign} {ctx[bound]} (got {_shown(given)})"
    if kind == "literal_error":
        expected = str(ctx["expected"])
        choice = "one of " if " or " in expected else ""
        return f"must be {choice}{expected} (got {_shown(given)})"
    text = detail["msg"]
    for said, meant in (("Input should be", "must be"), ("String should", "must"), ("List should", "must")):
        if text.startswith(said):
            text = meant + text[len(said) :]
    return f"{text} (got {_shown(given)})"


def _shown(value: Any) -> str:
    """A value as the user wrote it in YAML, briefly."""
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    text = json.dumps(value) if isinstance(value, (str, int, float, bool)) or value is None else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _unknown_field(loc: Loc, root: type[pydantic.BaseModel] | None) -> str:
    """`unknown field (did you mean savePeriod?)`, else the fields allowed there."""
    where = _model_at(root, loc[:-1]) if root is not None else None
    if where is None:
        return "unknown field"
    allowed = [field.alias or name for name, field in where.model_fields.items()]
    close = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.6)
    if close:
        return f"unknown field (did you mean {close[0]}?)"
    return f"unknown field; allowed here: {', '.join(allowed)}"


def _model_at(root: type[pydantic.BaseModel], loc: Loc) -> type[pydantic.BaseModel] | None:
    """The model that validates the object at `loc` under `root` (list indexes skipped); None past a plain dict."""
    current: Any = root
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, pydantic.BaseModel)):
            return None
        field = next((f for name, f in current.model_fields.items() if part in (name, f.alias)), None)
        if field is None:
            return None
        current = _item_type(field.annotation)
    return current if isinstance(current, type) and issubclass(current, pydantic.BaseModel) else None


def _item_type(annotation: Any) -> Any:
    """X for X, X | None and list[X]."""
    while True:
        origin, args = typing.get_origin(annotation), [a for a in typing.get_args(annotation) if a is not type(None)]
        if origin in (list, typing.Union, types.UnionType) and len(args) == 1:
            annotation = args[0]
        else:
            return annotation
