"""The driver's log lines: one readable line per event, in the driver and in every process of its Ray job.

    2026-12-04 21:37:57,104 INFO trainingrun_runtime.driver.entrypoint: run tiny finished at step 120, …
    (SingleController pid=4242) 2026-12-04 21:37:57,104 INFO trainingrun_runtime.driver.controller: step 2: reward …

The entrypoint calls `configure()` for the driver; `setup` passes `RUNTIME_ENV` to `ray.init`, so that each worker
process of the job (the controller, trainer, generation and TransferQueue actors) runs it too, as Ray's
`worker_process_setup_hook`, before it hosts an actor. Ray forwards a worker's lines to the driver behind its
`(ActorName pid=N)` prefix, uncoloured (`plain_worker_prefix`) since the driver writes to a file or a pod's log.

Ray's own `ray.LoggingConfig` is not used: its text format appends each record's context (`job_id=… worker_id=…
node_id=… actor_id=… task_id=… timestamp_ns=…`) to every line, and the driver printed its own lines twice.
The stderr lines the operator classifies an attempt by (`RestoreFailed: …`, …) are printed, not logged.
"""

from __future__ import annotations

import logging
import os
import sys

__all__ = ["FORMAT", "RUNTIME_ENV", "configure", "plain_worker_prefix"]

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
RUNTIME_ENV = {"worker_process_setup_hook": f"{__name__}.configure"}
"""`ray.init(runtime_env=…)`: every worker process of the job configures its logging as the driver does."""


def configure() -> None:
    """This process logs INFO and above to stderr, one `FORMAT` line per record."""
    logging.basicConfig(level=logging.INFO, format=FORMAT, stream=sys.stderr)


def plain_worker_prefix() -> None:
    """The driver forwards its workers' lines without colour codes around their `(ActorName pid=N)` prefix, unless
    RAY_COLOR_PREFIX says otherwise (Ray reads it in the driver, as it prints each line)."""
    os.environ.setdefault("RAY_COLOR_PREFIX", "0")
