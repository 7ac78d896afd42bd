"""`python -m trainingrun_runtime`: see `driver.entrypoint` for arguments and exit codes."""

import sys

from trainingrun_runtime.driver import entrypoint

sys.exit(entrypoint.main())
