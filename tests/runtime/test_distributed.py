"""GL302 under torchrun: two CPU processes with gloo, all-reduces counted through DDP's comm hook."""

from __future__ import annotations

import os
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
