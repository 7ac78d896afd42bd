"""The operator's pure core: the TrainingRun model, the phases, why an attempt ended, the decision
(spec, status, observed, now) -> status patch + actions, and the builders of the child objects (RayJob, identity,
NetworkPolicy, pod templates).

No I/O: no kopf, no Kubernetes client, no subprocess, socket, asyncio, aiohttp, os or time, and no clock of its
own (`now` is an argument). Both edges, `kube` and `localmode`, call it; it imports neither (pyproject.toml's
import-linter contracts).
"""
