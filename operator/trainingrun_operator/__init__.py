"""trainingrun control plane: the TrainingRun model, the pure reconcile core, the KubeRay adapter and kopf handlers.

This package imports no torch and no ray.
"""
