"""`python -m trainingrun_runtime`: see `driver` for arguments and exit codes."""

import sys

from trainingrun_runtime import driver

sys.exit(driver.main())
