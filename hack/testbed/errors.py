"""The test bed's failures that more than one module raises or catches, each with what the caller does about it.

Who raises them: `binaries` (MissingBinaries) and `controlplane.ControlPlane` (TestbedError, KubectlError). Who
catches them: `tests/conftest.py` and the `up` commands (`controlplane.py`, `fullloop.py`) turn MissingBinaries
into "run `make testbed`"; everything else reaches the test as its failure. The pod runner, the proxy, KubeRay
and the chaos controls keep their own error next to the code that raises it.
"""

from __future__ import annotations


class TestbedError(RuntimeError):
    """The test bed could not start or answer; the message names the component and shows its log tail."""


class MissingBinaries(TestbedError):
    """The pinned binaries are not built; `make testbed` builds them (retrying helps only after that)."""


class KubectlError(TestbedError):
    """A kubectl command exited non-zero; the message carries the command and its stderr."""
