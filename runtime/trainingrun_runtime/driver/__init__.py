"""The driver process and its Ray actors: the entrypoint, setup and restore, the controller, workers, reports.

`python -m trainingrun_runtime` runs `entrypoint.main`; `setup.setup_single_controller` builds and restores
everything on the driver, then the controller actor runs the pumps and the saves.
"""
