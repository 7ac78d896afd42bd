"""trainingrun control plane: the TrainingRun model, the pure reconcile core, the KubeRay adapter and kopf handlers.

Three layers, one subpackage each, and the `trainingrun` command (`cli.py`) above them:

    cli.py        trainingrun operator | trainingrun run
    kube/         the Kubernetes edge: kopf handlers, the reconcile pass, every API call, /metrics
    localmode/    `trainingrun run` on one machine: the driver as a local process, the reaper, the run file
    core/         pure: (spec, status, observed, now) -> status patch + actions, and the objects to create

kube and localmode import the core, never each other; the core imports neither, and no I/O library. The
import-linter contracts in pyproject.toml hold this. This package imports no torch and no ray.
"""
