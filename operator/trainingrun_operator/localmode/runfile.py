"""A TrainingRun YAML file, as `trainingrun run` (local.py) reads it: the text, its YAML documents, the first
TrainingRun among them, checked as the operator checks one (validation.run_problems).

Whatever keeps the file from running is an errors.InvalidInput that says where: the file; the line and column of
a YAML error; every invalid field with the line and column of its key (the YAML nodes keep where each key is).
metadata.name is held to the rule the CRD gives the API server (`RUN_NAME`, `RUN_NAME_MAX`): locally it names the
run's directory under --root, so `../x` or `/tmp/x` would put the run's files outside it.
"""

from __future__ import annotations

import pathlib
import re
from collections.abc import Mapping
from typing import Any

import yaml

from trainingrun_operator.core import errors, model, validation

__all__ = ["FILE_FIELDS", "RUN_NAME", "RUN_NAME_MAX", "load"]

RUN_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
"""metadata.name, as the CRD's rule has it (fullmatch): a DNS-1035 label."""
RUN_NAME_MAX = 40
"""The CRD's bound on metadata.name: the RayJob name <run>-a<attempt> must fit KubeRay's 47 characters."""


def load(path: pathlib.Path) -> model.TrainingRun:
    """The first TrainingRun in a YAML file, checked as the operator checks one: metadata.name against the CRD's
    rule, the model (the CRD's mirror) and spec.trainer against the runtime's RuntimeConfig
    (validation.run_problems). `status` in the file is ignored; a relative model.path or data.path is made absolute
    against the file's directory (`FILE_FIELDS`).

    Raises errors.InvalidInput naming the file, and the line and column of a YAML error or of every invalid field.
    """
    documents = _yaml_documents(path, _text_of(path))
    runs = [(node, doc) for node, doc in documents if isinstance(doc, dict) and doc.get("kind") == model.KIND]
    if not runs:
        raise errors.InvalidInput(
            f"{path}: no TrainingRun in this file ({_what_is_in(documents)}); "
            f"a TrainingRun starts with `apiVersion: {model.API_VERSION}` and `kind: {model.KIND}`"
        )
    node, doc = runs[0]
    doc = {**doc, "status": None}
    found = _name_problems(doc) + validation.run_problems(doc)
    if found:
        raise errors.InvalidInput(_problems_message(path, node, doc, found))
    return model.TrainingRun.model_validate(_files_from(doc, path.resolve().parent))


FILE_FIELDS = (("model", "path"), ("data", "path"))
"""The fields of spec.trainer that name a file or directory: locally, a relative one is read from the YAML file's
directory (on a cluster every path is absolute inside the pod)."""


def _files_from(doc: dict[str, Any], directory: pathlib.Path) -> dict[str, Any]:
    """`doc` with each relative path of `FILE_FIELDS` made absolute against `directory`."""
    trainer = dict(doc["spec"].get("trainer") or {})
    for section, key in FILE_FIELDS:
        part = trainer.get(section)
        if isinstance(part, Mapping) and isinstance(part.get(key), str) and not pathlib.Path(part[key]).is_absolute():
            trainer[section] = {**part, key: str(directory / part[key])}
    return {**doc, "spec": {**doc["spec"], "trainer": trainer}}


def _name_problems(doc: Mapping[str, Any]) -> list[validation.Problem]:
    """metadata.name against `RUN_NAME` and `RUN_NAME_MAX`; a name that is missing or not a string is the model's
    to report."""
    metadata = doc.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if not isinstance(name, str) or (RUN_NAME.fullmatch(name) and len(name) <= RUN_NAME_MAX):
        return []
    size = f" ({len(name)} characters)" if len(name) > RUN_NAME_MAX else ""
    suggested = _suggested_name(name)
    explained = (
        f"must be a DNS-1035 label of at most {RUN_NAME_MAX} characters (lowercase letters, digits and '-', starting "
        f"with a letter, ending with a letter or digit), as on a cluster; got {name!r}{size}; rename the run"
        + (f", e.g. `name: {suggested}`" if suggested else "")
    )
    return [validation.Problem(("metadata", "name"), explained, explained)]


def _suggested_name(name: str) -> str:
    """`name` made into a valid run name (lowercased, other characters as '-', cut to size); "" if nothing is left."""
    label = re.sub(r"[^a-z0-9]+", "-", name.lower())
    label = re.sub(r"^[^a-z]+", "", label)[:RUN_NAME_MAX]
    return label.rstrip("-")


def _text_of(path: pathlib.Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise errors.InvalidInput(f"{path}: no such file") from exc
    except IsADirectoryError as exc:
        raise errors.InvalidInput(f"{path}: is a directory; give a TrainingRun YAML file") from exc
    except UnicodeDecodeError as exc:
        raise errors.InvalidInput(f"{path}: not a text file (byte {exc.start} is not UTF-8)") from exc
    except OSError as exc:
        raise errors.InvalidInput(f"{path}: cannot read it: {exc.strerror or exc}") from exc


def _yaml_documents(path: pathlib.Path, text: str) -> list[tuple[yaml.Node, Any]]:
    """Each YAML document of `text`: its node (where each key is) and its value."""
    try:
        nodes = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
        return [(node, yaml.SafeLoader("").construct_document(node)) for node in nodes]
    except yaml.YAMLError as exc:
        raise errors.InvalidInput.in_yaml(str(path), exc) from exc


def _what_is_in(documents: list[tuple[yaml.Node, Any]]) -> str:
    if not documents:
        return "it is empty"
    found = []
    for _node, doc in documents:
        if isinstance(doc, dict) and doc.get("kind"):
            name = (doc.get("metadata") or {}).get("name") if isinstance(doc.get("metadata"), dict) else None
            found.append(f"{doc['kind']} {name}" if name else str(doc["kind"]))
        elif isinstance(doc, dict):
            found.append("a mapping without kind")
        else:
            found.append(
                {type(None): "an empty document", list: "a list", str: "plain text"}.get(type(doc), "a single value")
            )
    return "found: " + ", ".join(found)


def _problems_message(
    path: pathlib.Path, node: yaml.Node, doc: Mapping[str, Any], found: list[validation.Problem]
) -> str:
    """`FILE: TrainingRun NAME has N invalid fields:` then `  FILE:LINE:COLUMN: PATH: RULE` in the file's order."""
    rows = sorted(((_position(node, p.loc), p) for p in found), key=lambda row: row[0])
    metadata = doc.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    what = f"TrainingRun {name}" if name else "the TrainingRun"
    count = f"{len(found)} invalid field{'s' if len(found) > 1 else ''}"
    lines = [f"  {path}:{line}:{column}: {problem.path}: {problem.explained}" for (line, column), problem in rows]
    return "\n".join([f"{path}: {what} has {count}:", *lines])


def _position(node: yaml.Node, loc: tuple[str | int, ...]) -> tuple[int, int]:
    """Line and column (from 1) of the key at `loc` under `node`; of its nearest present parent if it is missing."""
    mark = node.start_mark
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            hit = next(
                (pair for pair in node.value if isinstance(pair[0], yaml.ScalarNode) and pair[0].value == part), None
            )
            if hit is None:
                break
            mark, node = hit[0].start_mark, hit[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            mark = node.start_mark
        else:
            break
    return mark.line + 1, mark.column + 1
