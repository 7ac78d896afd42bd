"""The user's journey on the full loop: `kubectl apply` the tiny example, our operator (its own process, the chart's
identity) creates a RayJob, the real KubeRay runs it on Ray pods the pod runner plays, the real driver checkpoints
and reports, the head pod is evicted, attempt 2 resumes from the recorded step, and the run succeeds
(support/journeys.py; tests/e2e/test_chart_operator.py runs the same journey against the chart's operator).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from support import journeys

if TYPE_CHECKING:
    from conftest import Loop  # tests/e2e/conftest.py

pytestmark = pytest.mark.e2e


def test_an_evicted_head_is_survived_and_attempt_2_resumes_from_the_recorded_step(loop: Loop, namespace: str) -> None:
    journeys.evicted_head_is_survived(loop, namespace)
