"""runfile.load on metadata.name: a local run's name names its directory under --root, so it is held to the rule
the CRD gives the API server, and a name that would leave the root is refused with the field named."""

from __future__ import annotations

import pathlib

import pytest
import yaml

from trainingrun_operator.core import errors
from trainingrun_operator.localmode import runfile

REPO = pathlib.Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "manifests" / "examples" / "tiny.yaml"
CRD = REPO / "manifests" / "crd" / "trainingrun.dev_trainingruns.yaml"


def named(tmp_path: pathlib.Path, name: str) -> pathlib.Path:
    """tiny.yaml with metadata.name set to `name`, written to tmp_path/run.yaml."""
    text = EXAMPLE.read_text()
    assert text.count("  name: tiny\n") == 1
    path = tmp_path / "run.yaml"
    path.write_text(text.replace("  name: tiny\n", f"  name: {yaml.safe_dump(name).splitlines()[0]}\n"))
    return path


@pytest.mark.parametrize(
    "name, suggested",
    [
        ("../x", "x"),
        ("/tmp/x", "tmp-x"),
        ("Upper", "upper"),
        ("a" * 64, "a" * 40),
        ("a" * 41, "a" * 40),
        ("x-", "x"),
        ("9lives", "lives"),
    ],
)
def test_a_name_that_is_not_a_short_dns_1035_label_is_refused_naming_the_field_and_a_fix(
    tmp_path: pathlib.Path, name: str, suggested: str
) -> None:
    path = named(tmp_path, name)
    with pytest.raises(errors.InvalidInput) as refused:
        runfile.load(path)
    first, *rows = str(refused.value).splitlines()
    assert first == f"{path}: TrainingRun {name} has 1 invalid field:"
    assert rows == [
        f"  {path}:8:3: metadata.name: must be a DNS-1035 label of at most 40 characters (lowercase letters, digits "
        f"and '-', starting with a letter, ending with a letter or digit), as on a cluster; got {name!r}"
        + (f" ({len(name)} characters)" if len(name) > 40 else "")
        + f"; rename the run, e.g. `name: {suggested}`"
    ]
    assert runfile.RUN_NAME.fullmatch(suggested) and len(suggested) <= runfile.RUN_NAME_MAX, "the fix is valid"


def test_a_bad_name_is_reported_with_the_specs_invalid_fields_in_the_files_order(tmp_path: pathlib.Path) -> None:
    path = named(tmp_path, "../x")
    path.write_text(path.read_text().replace("steps: 120", "steps: -5"))
    with pytest.raises(errors.InvalidInput) as refused:
        runfile.load(path)
    fields = [row.split(": ")[1] for row in str(refused.value).splitlines()[1:]]
    assert fields == ["metadata.name", "spec.trainer.steps"]


@pytest.mark.parametrize("name", ["tiny", "a", "run-2", "a" * 40])
def test_a_good_name_is_still_accepted(tmp_path: pathlib.Path, name: str) -> None:
    assert runfile.load(named(tmp_path, name)).metadata.name == name


def test_the_name_rule_is_the_crds(tmp_path: pathlib.Path) -> None:
    """The rule is written twice, once in the CRD's CEL (the API server's) and once here: they must agree."""
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    rules = [r["rule"] for r in version["schema"]["openAPIV3Schema"]["x-kubernetes-validations"]]
    assert f"size(self.metadata.name) <= {runfile.RUN_NAME_MAX}" in rules
    assert f"self.metadata.name.matches('^{runfile.RUN_NAME.pattern}$')" in rules


def test_a_relative_model_or_data_path_is_read_from_the_yaml_files_directory_and_an_absolute_one_is_kept(
    tmp_path: pathlib.Path,
) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    trainer = doc["spec"]["trainer"]
    for key in ("model", "task"):
        trainer.pop(key)
    trainer["model"] = {"path": "models/mine"}
    trainer["data"] = {"path": "/data/problems.jsonl"}
    trainer["reward"] = {"kind": "math"}
    (tmp_path / "dir").mkdir()
    path = tmp_path / "dir" / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    loaded = runfile.load(tmp_path / "dir" / ".." / "dir" / "run.yaml").spec.trainer
    assert loaded["model"] == {"path": str(tmp_path / "dir" / "models" / "mine")}
    assert loaded["data"] == {"path": "/data/problems.jsonl"}
