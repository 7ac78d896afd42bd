"""Local mode, `trainingrun run`: one TrainingRun on this machine without an API server. The run file
(`runfile`), the loop that runs the core's decision over local processes (`local`), an attempt's driver as a
process (`driver_process`), finding every process of an attempt (`processes`) and the reaper of what its Ray
leaves behind (`reaper`). It imports the core, never `kube`; kopf and the Kubernetes client are not needed.
"""
