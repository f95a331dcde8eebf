"""Launched by torchrun from test_distributed.py: judge a DDP fixture against its markers on every rank."""

import os
import sys

import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import marker_findings  # noqa: E402

from gradlint.runtime.predicates import evaluate  # noqa: E402
from gradlint.runtime.run import run_and_judge  # noqa: E402

rank = os.environ.get("RANK", "?")
for path in sys.argv[1:]:
    report = run_and_judge(path, marker_findings(path), steps=3)
    if dist.is_initialized():  # stopped before the script's own clean-up
        dist.destroy_process_group()
    backwards = [e for e in report.events if e.kind.value == "BACKWARD"]
    synced = [e.facts["synced"] for e in backwards]
    violations = {code: len(v) for code, (v, _, _) in evaluate(report.events).items() if v}
    print(f"rank {rank} {os.path.basename(path)} synced={synced} violations={violations}")
    for v in report.verdicts:
        print(f"rank {rank} {os.path.basename(path)} {v.finding.code} {v.status}: {v.evidence}")
