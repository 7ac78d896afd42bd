"""`kubectl apply` rejects what the operator would reject later: a few hundred malformed TrainingRuns, made from
the shipped examples (support/mutations.py: wrong types, fractional counts, values past their bounds, wrong enums,
unknown keys anywhere under spec and spec.trainer, quantities that are not, huge strings, path escapes, the rules
across fields), sent to the real API server, each rejected at admission with its field named; the examples
themselves accepted.

Each request is a server-side dry run (`dryRun=All`: admission runs in full, nothing is stored) with strict field
validation (`fieldValidation=Strict`, what kubectl asks for by default, so an unknown key is an error and not
silently pruned), sent from a few threads at once over the test bed's keep-alive connections.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any

import pytest

from support import mutations

pytestmark = pytest.mark.cluster

THREADS = 8


def create(control_plane: Any, namespace: str, docs: list[dict[str, Any]]) -> list[tuple[int, Any]]:
    """POST every doc as a dry run, concurrently; (HTTP status, body) in the docs' order."""
    path = f"/apis/trainingrun.dev/v1alpha1/namespaces/{namespace}/trainingruns?dryRun=All&fieldValidation=Strict"
    with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(lambda doc: control_plane.request("POST", path, doc), docs))


def names(body: Any, field: str) -> bool:
    """Does the API server's answer name `field`: as a cause's field, or in the message, followed by ':' or quoted
    (strict decoding names an unknown key only in its message: `unknown field "spec.x.notAField"`, and a mapping
    given for a list as its key under the list's field: `unknown field "spec.ray.workers.a"`)?"""
    if not isinstance(body, dict):
        return False
    causes = (body.get("details") or {}).get("causes") or []
    message = str(body.get("message", ""))
    quoted = f'"{field}"' in message or f'"{field}.' in message
    return any(c.get("field") == field for c in causes) or f"{field}:" in message or quoted


def test_the_shipped_examples_are_accepted(control_plane: Any, namespace: str) -> None:
    answers = create(control_plane, namespace, [doc for _, doc in mutations.examples()])
    assert [status for status, _ in answers] == [201] * len(answers), answers


def test_every_mutation_of_the_examples_is_rejected_at_admission_naming_the_field(
    control_plane: Any, namespace: str
) -> None:
    corpus = mutations.corpus()
    started = time.monotonic()
    answers = create(control_plane, namespace, [m.doc for m in corpus])
    took = time.monotonic() - started
    accepted = [m.name for m, (status, _) in zip(corpus, answers, strict=True) if status < 400]
    unnamed = [
        f"{m.name}: wanted {m.field}, got {status} {str((body or {}).get('message', body))[:300]}"
        for m, (status, body) in zip(corpus, answers, strict=True)
        if status >= 400 and not names(body, m.field)
    ]
    assert accepted == [], f"{len(accepted)} of {len(corpus)} accepted"
    assert unnamed == [], f"{len(unnamed)} of {len(corpus)} rejected without naming the field:\n" + "\n".join(unnamed)
    assert {status for status, _ in answers} <= {400, 422}
    print(f"{len(corpus)} mutations rejected in {took:.1f}s ({THREADS} threads)")


def test_the_trainers_math_cannot_change_once_the_run_has_a_checkpoint(control_plane: Any, namespace: str) -> None:
    """A transition rule on the real API server: before the first recorded checkpoint spec.trainer may change; after
    it the math fields (the checkpoint's config hash) are refused naming spec.trainer, and the step limit is not."""
    _, doc = mutations.examples()[0]
    name = doc["metadata"]["name"]
    runs = f"/apis/trainingrun.dev/v1alpha1/namespaces/{namespace}/trainingruns"
    status, body = control_plane.request("POST", runs, doc)
    assert status == 201, body

    def patch(body: dict[str, Any], subresource: str = "") -> tuple[int, Any]:
        path = f"{runs}/{name}{subresource}"
        answer: tuple[int, Any] = control_plane.request(
            "PATCH", path, body, content_type="application/merge-patch+json"
        )
        return answer

    lr = {"spec": {"trainer": {"grpo": {"lr": 0.01}}}}
    assert patch(lr)[0] == 200, "no checkpoint yet: the math may change"
    latest = {"step": 4, "path": f"/checkpoints/{name}/step_4", "attempt": 1, "time": "2026-12-04T00:00:00Z"}
    assert patch({"status": {"checkpoints": {"latest": latest}}}, "/status")[0] == 200
    status, body = patch({"spec": {"trainer": {"grpo": {"lr": 0.02}}}})
    assert status == 422 and names(body, "spec.trainer"), body
    assert "another name" in str(body)
    assert patch({"spec": {"trainer": {"steps": 999}}})[0] == 200, "the step limit may change"
