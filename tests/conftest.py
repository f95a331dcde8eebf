"""Shared test set-up: helpers importable under pytest's importlib mode, slow tests and fuzzing sizes.

``slow`` tests (the real-package sweep, interrupted fixing, full-size
fuzzing) run in CI (``CI=true``) and when asked for (``-m slow`` or
``GRADLINT_SLOW=1``); elsewhere they are skipped. Property tests run the
hypothesis profile ``ci`` (500 examples each) there, and ``dev`` (fewer)
otherwise.
"""

import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run_size import full_run  # noqa: E402


_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile("ci", max_examples=500, deadline=None, suppress_health_check=_QUIET, print_blob=True)
settings.register_profile("dev", max_examples=25, deadline=None, suppress_health_check=_QUIET)
settings.load_profile("ci" if full_run() else "dev")


def pytest_configure(config):
    if full_run(config):
        settings.load_profile("ci")


def pytest_collection_modifyitems(config, items):
    if full_run(config):
        return
    skip = pytest.mark.skip(reason="slow: run with -m slow or GRADLINT_SLOW=1 (CI runs it)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
