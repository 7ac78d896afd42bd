"""The CRD's schema of `spec.trainer`, generated from the runtime's own config model. Pure.

Who calls it: `operator/sync_manifests.py` writes `trainer_schema()` into the CRD source
(manifests/crd/trainingrun.dev_trainingruns.yaml), in its region `# BEGIN GENERATED trainer` ... `# END GENERATED
trainer`; tests/unit/operator/test_manifests.py fails when the file and the model disagree.

One source: `trainingrun_runtime.config.TrainerConfig` (pydantic) is what the driver and the operator's own
validation (`validation.py`) check, so the API server checks the same at admission, field by field:

    pydantic                          OpenAPI v3 (structural, as Kubernetes wants it)
    int / float                       type: integer / type: number
    ge, le / gt, lt                   minimum, maximum / the same with exclusiveMinimum, exclusiveMaximum: true
    Literal[...]                      type: string, enum
    X | None                          X, nullable: true
    tuple[float, float]               type: array, items, minItems = maxItems = 2
    a nested model                    type: object, its properties inlined (no $ref in a CRD)
    extra="forbid"                    no additionalProperties: unknown keys are rejected (kubectl's strict field
                                      validation) or pruned, like everywhere else in the spec
    json_schema_extra                 kept when it is `x-kubernetes-validations` (CEL: a rule across fields)

Keys are the camelCase aliases only: the API server's objects are camelCase, so `prompts_per_step`, which the
runtime also accepts, is an unknown field in a TrainingRun. Defaults are not copied (they live in the config
class, which applies them; the descriptions say them), so the stored object holds what the user wrote.

Anything the converter does not know (a new kind of field in the config) raises ValueError naming the field: the
sync script then fails instead of writing a schema that checks less than the model. A plain string field must say
its maximum length (`max_length`), and a number both of its bounds (`ge` or `gt`, `le` or `lt`), so no string and no
number under `spec` is unbounded (a deadline of 10**12 seconds is refused at admission, not in the arithmetic);
a bound is at most 2**53 (the API server compares with it as a float64: 2**63 - 1 would round past int64).
"""

from __future__ import annotations

from typing import Any

import pydantic

from trainingrun_runtime.config import TrainerConfig

__all__ = ["openapi", "trainer_schema"]

# JSON Schema keys that carry no check, or none the API server would make: dropped.
_IGNORED = frozenset({"title", "default", "additionalProperties", "examples"})
_BOUNDS = ("minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems", "pattern", "enum", "format")


def trainer_schema() -> dict[str, Any]:
    """The OpenAPI schema of `spec.trainer`; `{}` when absent (a spec.driver program may need none, and the CRD's
    rules read spec.trainer's fields)."""
    return {**openapi(TrainerConfig), "default": {}}


def openapi(model: type[pydantic.BaseModel]) -> dict[str, Any]:
    """A pydantic model's validation schema as a Kubernetes structural OpenAPI v3 schema (see the module table)."""
    schema = model.model_json_schema(by_alias=True, mode="validation")
    return _convert(schema, schema.get("$defs", {}), model.__name__)


def _convert(node: dict[str, Any], defs: dict[str, Any], where: str) -> dict[str, Any]:
    if "$ref" in node:
        name = node["$ref"].removeprefix("#/$defs/")
        return _convert(defs[name], defs, where)  # the class's own description, not the field's
    if "anyOf" in node:
        kinds = [k for k in node["anyOf"] if k != {"type": "null"}]
        if len(kinds) != 1 or len(kinds) == len(node["anyOf"]):
            raise ValueError(f"{where}: only `X | None` unions convert (got {node['anyOf']})")
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        return {**_convert({**kinds[0], **rest}, defs, where), "nullable": True}
    unknown = (
        set(node)
        - _IGNORED
        - set(_BOUNDS)
        - {
            "type",
            "description",
            "properties",
            "required",
            "items",
            "prefixItems",
            "exclusiveMinimum",
            "exclusiveMaximum",
            "$defs",
            "x-kubernetes-validations",
        }
    )
    if unknown:
        raise ValueError(f"{where}: no OpenAPI conversion for {sorted(unknown)}")
    kind = node.get("type")
    if kind not in ("object", "array", "integer", "number", "string", "boolean"):
        raise ValueError(f"{where}: no OpenAPI conversion for type {kind!r}")
    out: dict[str, Any] = {"type": kind}
    if "description" in node:
        out["description"] = node["description"]
    out.update({key: node[key] for key in _BOUNDS if key in node})
    for exclusive, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if exclusive in node:  # JSON Schema 2020-12's number -> OpenAPI 3.0's flag
            out[bound], out[exclusive] = node[exclusive], True
    if kind == "string" and "enum" not in out and "maxLength" not in out:
        raise ValueError(f"{where}: a string field needs a max_length (no string under spec is unbounded)")
    if any(abs(out.get(bound, 0)) > 2**53 for bound in ("minimum", "maximum")):
        raise ValueError(f"{where}: a bound past 2**53 is not exact as the float64 the API server compares with")
    if kind in ("integer", "number") and not ("minimum" in out and "maximum" in out):
        raise ValueError(
            f"{where}: a number field needs both bounds, ge or gt and le or lt (no number under spec is unbounded)"
        )
    if kind == "object":
        properties = node.get("properties", {})
        out["properties"] = {name: _convert(child, defs, f"{where}.{name}") for name, child in properties.items()}
        if node.get("required"):
            out["required"] = list(node["required"])
        if "x-kubernetes-validations" in node:
            out["x-kubernetes-validations"] = node["x-kubernetes-validations"]
    if kind == "array":
        out["items"] = _items(node, defs, where)
    return out


def _items(node: dict[str, Any], defs: dict[str, Any], where: str) -> dict[str, Any]:
    """An array's item schema; a tuple's positions must all have the same schema (OpenAPI 3.0 has no tuples)."""
    if "items" in node:
        return _convert(node["items"], defs, f"{where}[]")
    positions = [_convert(item, defs, f"{where}[{i}]") for i, item in enumerate(node.get("prefixItems", []))]
    if not positions or any(p != positions[0] for p in positions):
        raise ValueError(f"{where}: only arrays of one item schema convert (got {node.get('prefixItems')})")
    return positions[0]
