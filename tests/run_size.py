"""Whether this test run is a full one (CI's), which runs the slow tests and the full-size fuzzing."""

import os


def full_run(config=None) -> bool:
    """CI (``CI=true``), ``GRADLINT_SLOW=1``, or ``-m slow`` on the command line (when ``config`` is given)."""
    asked = config is not None and "slow" in (config.getoption("-m") or "")
    return asked or os.environ.get("GRADLINT_SLOW") == "1" or os.environ.get("CI") == "true"
