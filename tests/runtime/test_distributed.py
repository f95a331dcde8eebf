"""GL302 under torchrun: two CPU processes with gloo, all-reduces counted through DDP's comm hook."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys

import pytest
import torch.distributed as dist

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")

HERE = os.path.dirname(os.path.abspath(__file__))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(_free_port()), *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        # SIGTERM lets torchrun stop its workers (they run in their own sessions)
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        pytest.fail(f"torchrun did not finish in 180 s:\n{out}\n{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def test_gl302_confirmed_without_no_sync(fixtures_dir):
    # one script per launch: re-initialising a process group inside one torchrun launch can race
    proc = _torchrun(os.path.join(HERE, "ddp_driver.py"), os.path.join(fixtures_dir, "run_ddp_accumulation.py"))
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr[-3000:]
    for rank in ("0", "1"):
        confirmed = f"rank {rank} run_ddp_accumulation.py GL302 confirmed: step 1 of SGD#0 paid all-reduces on 4 of its 4"
        assert confirmed in out
        assert f"rank {rank} run_ddp_accumulation.py synced=[1, 1, 1, 1," in out


def test_no_sync_synchronises_once_per_step(fixtures_dir):
    proc = _torchrun(os.path.join(HERE, "ddp_driver.py"), os.path.join(fixtures_dir, "run_ddp_no_sync.py"))
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr[-3000:]
    for rank in ("0", "1"):
        assert f"rank {rank} run_ddp_no_sync.py synced=[0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1] violations={{}}" in out


def test_gradlint_run_module_under_torchrun_prints_one_merged_report_from_rank_0(fixtures_dir):
    pytest.importorskip("gradlint.linter")
    proc = _torchrun("-m", "gradlint.runtime", "run", os.path.join(fixtures_dir, "run_ddp_accumulation.py"), "--steps", "2")
    out = proc.stdout
    assert out.count("gradlint run run_ddp_accumulation.py: 2 optimizer steps (stopped)") == 1, out + proc.stderr[-3000:]
    # rank 0's report only: 2 steps x 4 micro-batches, then the 4 of the step the run was stopped before
    assert out.count("BACKWARD(factor=0.25, synced=1)") == 12
    assert "merged over 2 ranks" in out
    assert "line 21: GL302 confirmed on ranks 0, 1" in out
    # GL302 confirmed: exit 1 from rank 0; the other rank handed its report over and exited 0
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "SIGABRT" not in proc.stderr and "Signal 6" not in proc.stderr


def test_gradlint_measure_under_torchrun_prints_one_table_from_rank_0_with_every_rank_s_peaks(fixtures_dir):
    # Each mode runs the script again in a process of its own, and every run creates
    # its default process group anew in the same torchrun store.
    proc = _torchrun("-m", "gradlint.runtime", "measure", os.path.join(fixtures_dir, "run_ddp_accumulation.py"),
                     "--steps", "2", "--time-steps", "3")
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr[-3000:]
    assert out.count("step time  max |Δparam|") == 1, out  # one table: rank 0's
    rows = [line.split() for line in out.splitlines() if line.startswith(("as written ", "set_to_none=True "))]
    assert [row[0] for row in rows] == ["as", "set_to_none=True"], out
    for row in rows:
        assert row[-2] == "ms" and float(row[-3]) > 0, row  # a measured step time
        assert row[-1] == "0", row  # the same parameters in both modes
    # four backwards per step: gradient release is ruled out, on every rank alike
    assert "gradient release: not applicable to this loop: gradient accumulation" in out
    merged = out.split("merged over 2 ranks (the table above is rank 0's):\n")[1].splitlines()
    assert len(merged) == 3 and merged[2].startswith("  fused optimizer: largest peak "), out  # SGD: fused=True on offer
    for row, line in zip(rows, merged):
        # the ranks' peaks can differ by the few bytes the all-reduces allocate
        mode, own_peak = ("as written", " ".join(row[2:4])) if row[0] == "as" else (row[0], " ".join(row[1:3]))
        found = re.fullmatch(rf"  {mode}: largest peak (\S+ \S+) on rank (\d); rank 0 (\S+ \S+), rank 1 (\S+ \S+)", line)
        assert found, line
        largest, on_rank, *per_rank = found.groups()
        assert per_rank[0] == own_peak, line
        assert largest == per_rank[int(on_rank)] and _bytes(largest) == max(map(_bytes, per_rank)), line
    assert "Signal" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]


def _bytes(text: str) -> float:
    number, unit = text.split()
    return float(number) * 1024 ** ["B", "KiB", "MiB", "GiB"].index(unit)
