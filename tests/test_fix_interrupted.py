"""Killing ``gradlint --fix`` mid-run loses nothing: every file is its old bytes or its fully fixed version.

A run over many files is killed (SIGKILL: no clean-up runs) as soon as it
has written some of them, several times over; each time every file must be
whole, and a last uninterrupted run finishes the job.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from gradlint.fixer import fix_text

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")]

FILES = 150
PADDING = "".join(f"def helper_{i}(x):\n    return x + {i}\n\n\n" for i in range(15))


def source(n: int) -> str:
    """A training script with three fixable findings and enough other code that fixing it takes a while."""
    return (
        "import torch\n\n"
        f"model = torch.nn.Linear({n + 1}, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        f"{PADDING}"
        f"for i, x in enumerate(data_{n}):\n"
        "    opt.zero_grad(set_to_none=False)\n"
        "    loss = model(x).sum() / 4\n"
        "    loss.backward()\n"
        "    if (i + 1) % 4 == 0:\n"
        "        opt.step()\n"
    )


def snapshot(folder) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in sorted(os.listdir(folder)) if name.endswith(".py")}


def test_killed_fix_leaves_every_file_old_or_fully_fixed(tmp_path):
    old, new = {}, {}
    for n in range(FILES):
        name = f"train_{n:03d}.py"
        text = source(n)
        (tmp_path / name).write_text(text)
        fixed = fix_text(text, name)
        assert fixed.changed and fixed.result.findings == [] and fixed.fixed >= 2
        old[name], new[name] = text.encode(), fixed.text.encode()

    command = [sys.executable, "-m", "gradlint", "--fix", "--isolated", "."]
    kills = 0
    chance = random.Random(7)
    for _ in range(6):
        before = sum(snapshot(tmp_path)[name] == new[name] for name in new)
        if before == FILES:
            break
        process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while process.poll() is None and time.monotonic() < deadline:
                done = sum(data == new[name] for name, data in snapshot(tmp_path).items() if name in new)
                if done > before:  # it is writing: kill it at some moment of the next files
                    time.sleep(chance.uniform(0, 0.3))
                    process.send_signal(signal.SIGKILL)
                    kills += 1
                    break
                time.sleep(0.02)
        finally:
            process.kill()
            process.wait()
        files = snapshot(tmp_path)
        assert set(files) == set(old), "a file appeared or disappeared"
        torn = [name for name, data in files.items() if data not in (old[name], new[name])]
        assert torn == [], f"neither the old nor the fixed bytes: {torn[:5]}"
        leftovers = [name for name in os.listdir(tmp_path) if not name.endswith(".py")]
        assert all(name.startswith(".train_") and name.endswith(".gradlint") for name in leftovers), leftovers

    assert kills >= 2, "the runs finished before they could be interrupted: make the files larger"
    subprocess.run(command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, timeout=600)
    assert snapshot(tmp_path) == new
