"""topoplan's tests; shared code lives in :mod:`tests.support` and fixtures in conftest.py."""
