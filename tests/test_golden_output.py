"""The linter's output over the repository's own code is exactly the golden file (see tests/golden_output.py)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from golden_output import GOLDEN, current_output  # noqa: E402


def test_output_matches_golden_file():
    expected = json.loads(GOLDEN.read_text(encoding="utf-8"))
    actual = current_output()
    assert actual["findings"] == expected["findings"]
    assert actual["diff"] == expected["diff"]
    assert len(expected["findings"]) > 100  # the golden file really holds the fixtures' findings
