"""Malformed TrainingRuns made from the shipped examples, each with the field its rejection must name.

    for m in mutations.corpus():       m.name, m.doc (a whole TrainingRun), m.field ("spec.trainer.steps")

Used by tests/integration/test_operator_admission.py (every one is sent to the real API server, which must reject
it naming the field) and tests/unit/operator/test_admission_corpus.py (the same corpus, without a cluster, against
the CRD's schema through jsonschema, which checks the generator itself, and against the operator's own check, the
second line; `schema_checks` and `model_checks` mark what each of those cannot see).

Most mutations are derived from the CRD's own schema, walking it beside each example's `spec`: for every field the
schema declares (whether the example sets it or not) it writes the values that field's schema forbids: the wrong
type, a fractional count, one past each bound, a value outside its enum, a string one byte too long and a huge one,
a quantity that is not one, one entry too many, an integer past int64; and an unknown key in every object. Only
objects the example already has, or that need no required field, are entered (an inserted object must not fail
for another reason), and not the pod templates (`NOT_WALKED`).
A short hand-written list adds what a walk cannot derive: path escapes in `spec.checkpoint.path`, the rules across
fields (CEL), snake_case keys.

Field paths are written as the API server writes them: `spec.ray.workers[0].replicas`.
"""

from __future__ import annotations

import copy
import dataclasses
import pathlib
import re
from collections.abc import Callable, Iterator
from typing import Any

import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
CRD = REPO / "manifests" / "crd" / "trainingrun.dev_trainingruns.yaml"
EXAMPLES = ("tiny.yaml", "cluster.yaml", "qwen-math.yaml")
HUGE = 100_000
"""Characters in a huge string: far past every bound, well under the API server's request limit (3 MiB)."""
UNKNOWN = "notAField"
NOT_WALKED = frozenset({"template"})
"""The pod templates: KubeRay's PodTemplateSpec schema as generated (tests/integration/test_operator_templates.py
sends its typos and owned fields); walked, they alone would double the corpus."""
INT64_PAST = 2**63
"""One past the largest integer the API server stores (int64): rejected as `must be of type integer`."""

Path = tuple[str | int, ...]


@dataclasses.dataclass(frozen=True)
class Mutation:
    """One malformed TrainingRun: what was done (`name`), the object, and the field the rejection must name."""

    name: str
    doc: dict[str, Any]
    field: str
    schema_checks: bool = True
    """A JSON Schema validator of the CRD's schema rejects it too (False: only the API server's CEL rules or its
    int64 range do)."""
    model_checks: bool = True
    """The operator's own check (`validation.run_problems`: the models) rejects it too (False: the wrong JSON type for
    a scalar, which pydantic's lax mode reads anyway, `"7"` or `true` for a count, `"yes"` or `1` for a flag; an
    integer past int64, which Python does not bound)."""


def schema() -> dict[str, Any]:
    """The CRD's openAPIV3Schema."""
    crd = yaml.safe_load(CRD.read_text())
    return dict(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


def examples() -> list[tuple[str, dict[str, Any]]]:
    """(file name, TrainingRun) of every shipped example."""
    found = []
    for name in EXAMPLES:
        for doc in yaml.safe_load_all((REPO / "manifests" / "examples" / name).read_text()):
            if doc and doc.get("kind") == "TrainingRun":
                found.append((name, doc))
    return found


def shown(path: Path) -> str:
    """`spec.ray.workers[0].replicas`, as the API server names a field."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def corpus() -> list[Mutation]:
    """Every mutation of every example (see the module docstring)."""
    found: list[Mutation] = []
    spec_schema = schema()["properties"]["spec"]
    for example, doc in examples():
        for bad in [*_walk(doc["spec"], spec_schema, ("spec",)), *_by_hand(doc)]:
            name = f"{example}: {shown(bad.path)} = {_brief(bad.value)}"
            field = shown(bad.field or bad.path)
            found.append(Mutation(name, _set(doc, bad.path, bad.value), field, bad.schema_checks, bad.model_checks))
    return found


def _brief(value: Any) -> str:
    text = repr(value)
    if len(text) <= 40:
        return text
    return f"<{len(value)} chars>" if isinstance(value, str) else f"<{type(value).__name__} of {len(value)}>"


# ------------------------------------------------------------------------------------- derived from the schema


@dataclasses.dataclass(frozen=True)
class Bad:
    """A value to write at `path`; the rejection names `field` (default: `path`)."""

    path: Path
    value: Any
    field: Path | None = None
    schema_checks: bool = True
    model_checks: bool = True


def _walk(value: Any, node: dict[str, Any], path: Path) -> Iterator[Bad]:
    """Bad values for `path` (whose schema is `node`, whose value in the example is `value`), then its children."""
    yield from (dataclasses.replace(bad, path=path) for bad in _bad_values(node))
    kind = node.get("type")
    if kind == "integer":
        yield Bad(path, INT64_PAST, schema_checks=False, model_checks=False)
    if node.get("x-kubernetes-int-or-string"):  # a quantity (shmSize); a map of them is _map's
        yield from (Bad(path, bad) for bad in QUANTITIES)
        yield Bad(path, True, model_checks=False)
    if kind == "object" and "properties" in node:
        current = value if isinstance(value, dict) else {}
        if isinstance(value, dict) or not node.get("required"):
            yield Bad((*path, UNKNOWN), 1)
            for name, child in node["properties"].items():
                if name not in NOT_WALKED:
                    yield from _walk(current.get(name), child, (*path, name))
    elif kind == "object" and isinstance(node.get("additionalProperties"), dict):
        yield from _map(value, node, path)
    elif kind == "array" and isinstance(value, list) and value:
        yield from _walk(value[0], node["items"], (*path, 0))


def _bad_values(node: dict[str, Any]) -> list[Bad]:
    """Values `node`'s schema forbids, at an empty path (none for a node without a type: an int-or-string is handled
    by _map)."""
    kind = node.get("type")
    bad: list[Any] = []
    lax: list[Any] = []  # the wrong JSON type, which pydantic's lax mode reads anyway
    if kind == "integer":
        bad += [1.5]
        lax += ["7", True]
        bad += [node["minimum"] - 1] if "minimum" in node else []
        bad += [node["maximum"] + 1] if "maximum" in node else []
    elif kind == "number":
        bad += ["fast"]
        lax += [False]
        if "minimum" in node:
            bad.append(node["minimum"] if node.get("exclusiveMinimum") else node["minimum"] - 0.5)
        if "maximum" in node:
            bad.append(node["maximum"] if node.get("exclusiveMaximum") else node["maximum"] + 0.5)
    elif kind == "string":
        bad += [42]
        if "enum" in node:
            bad.append("NotOneOfThem")
        if "maxLength" in node:
            bad += ["a" * (node["maxLength"] + 1), "a" * HUGE]
        if "pattern" in node:
            bad += ["has spaces", "-leading-dash", "ends-with-dash-"]
        if node.get("minLength", 0) >= 1:
            bad.append("")
    elif kind == "boolean":
        lax += ["yes", 1]
    elif kind == "array":
        bad += ["not-a-list", {"a": 1}]
        item = _valid(node.get("items", {}))
        if "maxItems" in node and item is not None:
            bad.append([item] * (node["maxItems"] + 1))
        if "minItems" in node and item is not None and node["minItems"] > 0:
            bad.append([item] * (node["minItems"] - 1))
    elif kind == "object":
        bad += ["not-an-object", [1, 2]]
    # A string pattern can accept what one of its generic bad values shows (`-leading-dash` may be a fine label
    # value); keep only what the schema really forbids.
    return [Bad((), b) for b in bad if not _accepted(node, b)] + [Bad((), b, model_checks=False) for b in lax]


def _valid(node: dict[str, Any]) -> Any:
    """A value `node` accepts, for padding a list past its maxItems; None if none is obvious."""
    kind = node.get("type")
    if kind == "object" and not node.get("required"):
        return {}
    if kind == "number":
        return node.get("minimum", 0) + (0.5 if node.get("exclusiveMinimum") or "maximum" in node else 0)
    if kind == "integer":
        return node.get("minimum", 0)
    return None


def _accepted(node: dict[str, Any], value: Any) -> bool:
    """Whether a string pattern accepts a string `value` (the only case _bad_values can get wrong)."""
    return (
        node.get("type") == "string"
        and isinstance(value, str)
        and "pattern" in node
        and len(value) <= node.get("maxLength", len(value))
        and len(value) >= node.get("minLength", 0)
        and re.search(node["pattern"], value) is not None
    )


QUANTITIES = ["lots", "1GB", "1.5.2", "2 Gi", "--1", "1e", "0x10", "1" * 63 + "Mi", 1.5]
"""Not Kubernetes quantities (integers and strings like `2`, `500m`, `4Gi`, `1e3` are); the one that looks like one is
longer than the bound (64). Also `true`, which pydantic's lax mode reads as 1."""


def _map(value: Any, node: dict[str, Any], path: Path) -> Iterator[Bad]:
    """A map: a bad value under an existing (or a plausible) key, one entry too many, a CEL-rejected key."""
    items = node["additionalProperties"]
    current = value if isinstance(value, dict) else {}
    key = next(iter(current), "cpu" if items.get("x-kubernetes-int-or-string") else "somekey")
    if items.get("x-kubernetes-int-or-string"):
        yield from (Bad((*path, key), bad) for bad in QUANTITIES)
        yield Bad((*path, key), True, model_checks=False)
    else:
        yield from (dataclasses.replace(bad, path=(*path, key)) for bad in _bad_values(items))
    if "maxProperties" in node:
        filler = 1 if items.get("x-kubernetes-int-or-string") else "v"
        yield Bad(path, {f"example.com/r{i}": filler for i in range(node["maxProperties"] + 1)})
    if node.get("x-kubernetes-validations"):  # a key the map's rule refuses: a resource name, a ray start flag
        if items.get("x-kubernetes-int-or-string"):
            yield Bad((*path, "cpus"), 1, path, schema_checks=False)
        else:
            yield Bad((*path, "Not_A_Flag;"), "v", path, schema_checks=False)


# ---------------------------------------------------------------------------------------------- by hand

PATH_ESCAPES = ["../up", "a/../../b", "/etc", "..", ".", "a/./b", "a//b", "a/", "./a", "a\\b", "~/x", "%2e%2e/x"]


def _by_hand(doc: dict[str, Any]) -> list[Bad]:
    """What a walk cannot derive: path escapes, the rules across fields (CEL), snake_case keys, a beta of 1."""
    spec = doc["spec"]
    found = [Bad(("spec", "checkpoint", "path"), bad) for bad in PATH_ESCAPES]
    model = spec["trainer"].get("model", {})
    heads = ("spec", "trainer", "model", "nHeads")
    found.append(Bad(heads, _not_a_divisor(model.get("dModel", 64)), schema_checks=False))
    found.append(
        Bad(("spec", "trainer", "model", "dModel"), model.get("nHeads", 4) * 8 + 1, heads, schema_checks=False)
    )
    found += _model_and_data(spec["trainer"])
    found.append(Bad(("spec", "trainer", "prompts_per_step"), 8))
    found.append(Bad(("spec", "trainer", "grpo", "adamBetas"), [1.0, 0.9], ("spec", "trainer", "grpo", "adamBetas", 0)))
    found.append(Bad(("spec", "resume"), {"policy": "step"}, schema_checks=False))
    found.append(Bad(("spec", "resume"), {"policy": "latest", "step": 3}, schema_checks=False))
    found.append(
        Bad(("spec", "restartPolicy", "backoff"), {"initialSeconds": 60, "maxSeconds": 5}, schema_checks=False)
    )
    limits = ("spec", "ray", "head", "resources", "limits")
    found.append(Bad((*limits, "mem"), "1Gi", limits, schema_checks=False))
    params = ("spec", "ray", "head", "rayStartParams")  # they reach ray start's shell line unquoted (CEL)
    found.append(Bad(params, {"num-cpus; rm -rf /": "8"}, schema_checks=False))
    found.append(Bad(params, {"num-cpus": "8 && curl x"}, schema_checks=False))
    found.append(Bad(params, {"resources": "'{\"x\": $(id)}'"}, schema_checks=False))
    return found


def _model_and_data(trainer: dict[str, Any]) -> list[Bad]:
    """The rules across spec.trainer's model, data, task, reward and generation (CEL)."""
    at: Callable[..., Path] = lambda *names: ("spec", "trainer", *names)  # noqa: E731
    found = [
        Bad(at("reward"), {"kind": "function"}, at("reward", "function"), schema_checks=False),
        Bad(at("reward"), {"kind": "math", "function": "rewards:score"}, at("reward", "function"), schema_checks=False),
        Bad(
            at(),
            {**trainer, "generation": {"temperature": 0.5}, "grpo": {**trainer.get("grpo", {}), "temperature": 0.7}},
            at("grpo", "temperature"),
            schema_checks=False,
        ),
    ]
    rows = trainer.get("promptsPerStep", 8) * trainer.get("grpo", {}).get("groupSize", 8)
    if rows < 1024:  # more trainer ranks than a step has rows (within the field's own bound)
        found.append(Bad(at("trainerWorkers"), rows + 1, schema_checks=False))
    if "data" in trainer:  # a model of the user's own
        found.append(Bad(at("model", "dModel"), 32, at("model", "path"), schema_checks=False))
        found.append(Bad(at("task"), {"kind": "copy"}, schema_checks=False))
        found.append(Bad(at(), {k: v for k, v in trainer.items() if k != "reward"}, at("data"), schema_checks=False))
        found.append(
            Bad(at(), {k: v for k, v in trainer.items() if k != "data"}, at("model", "path"), schema_checks=False)
        )
    else:  # the built-in model and task
        found.append(Bad(at("data"), {"path": "problems.jsonl"}, schema_checks=False))
        found.append(Bad(at("model", "path"), "/models/mine", schema_checks=False))
        found.append(Bad(at("model", "dtype"), "bfloat16", at("model", "path"), schema_checks=False))
        found.append(Bad(at("generation"), {"maxNewTokens": 8}, at("generation", "maxNewTokens"), schema_checks=False))
    return found


def _not_a_divisor(width: int) -> int:
    return next(h for h in range(2, width + 2) if width % h)


def _set(doc: dict[str, Any], path: Path, value: Any) -> dict[str, Any]:
    """A deep copy of `doc` with `value` at `path` (objects on the way created when missing)."""
    out = copy.deepcopy(doc)
    node: Any = out
    for part in path[:-1]:
        if isinstance(part, int):
            node = node[part]
        else:
            node = node.setdefault(part, {})
    node[path[-1]] = value
    return out
