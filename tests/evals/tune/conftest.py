"""Fixtures the tune tests share."""

import pytest


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory):
    """CTXEVAL_CACHE for the module fixtures (conftest's autouse fixture is per test and starts after them)."""
    path = tmp_path_factory.mktemp("tune-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CTXEVAL_CACHE", str(path))
        yield path
