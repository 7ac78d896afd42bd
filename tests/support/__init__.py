"""Test tooling shared by the unit, integration and e2e tests (not shipped in any package): `from support import X`."""
