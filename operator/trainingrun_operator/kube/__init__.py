"""The operator's Kubernetes edge: kopf's triggers (`handlers`, the only kopf import), the reconcile pass that
gathers, calls the core's decision and applies it (`reconciler`), every API call (`apiclient`, the only import of
the Kubernetes client), per-run wake-ups (`wakeups`) and the /metrics exporter (`metrics`, the only
prometheus_client import). It imports the core, never `localmode`.
"""
