"""The tracer's DDP all-reduce hook: same gradients as DDP's own, and no callback left to the gloo threads at exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import weakref

import pytest
import torch
import torch.distributed as dist

from gradlint.runtime.ddp_hook import WaitableAllreduce
from gradlint.runtime.tracer import Tracer

needs_gloo = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")


def _done_future() -> torch.futures.Future:
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(None)
    return fut


def _pend(hook: WaitableAllreduce, seconds: float, fut: torch.futures.Future) -> weakref.ref:
    """Give ``hook`` a callback of the all-reduce ``fut`` that another thread holds for ``seconds``,
    as a gloo worker holds a callback it has run but not yet dropped."""

    def callback() -> None:
        pass

    threading.Thread(target=lambda held=callback: time.sleep(seconds)).start()
    ref = weakref.ref(callback)
    hook._pending.append((ref, fut))
    return ref


def test_wait_released_returns_once_the_thread_holding_a_callback_lets_go():
    hook = WaitableAllreduce()
    ref = _pend(hook, 0.3, _done_future())
    assert hook.pending() == 1
    start = time.monotonic()
    assert hook.wait_released(timeout=10)
    assert ref() is None and hook.pending() == 0
    assert time.monotonic() - start >= 0.2


def test_wait_released_gives_up_after_its_timeout():
    hook = WaitableAllreduce()
    ref = _pend(hook, 2.0, _done_future())
    assert not hook.wait_released(timeout=0.1)
    assert ref() is not None


def test_an_all_reduce_that_never_finished_is_not_waited_for():
    hook = WaitableAllreduce()
    ref = _pend(hook, 2.0, torch.futures.Future())  # never completed: a peer died
    start = time.monotonic()
    assert hook.wait_released(timeout=10)
    assert time.monotonic() - start < 1.0 and ref() is not None


def test_leaving_the_tracer_waits_for_the_callbacks_of_its_all_reduces():
    tracer = Tracer()
    with tracer:
        ref = _pend(tracer._ddp_allreduce, 0.3, _done_future())
    assert ref() is None


SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch, torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from gradlint.runtime.ddp_hook import WaitableAllreduce

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    grads = []
    hook = WaitableAllreduce()
    for use_hook in (False, True):
        torch.manual_seed(0)
        model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)), bucket_cap_mb=0.0001)
        if use_hook:
            model.register_comm_hook(None, lambda state, bucket: hook(state, bucket))  # wrapped, as the tracer does
        for _ in range(3):
            model(torch.randn(4, 8)).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    same = all(torch.equal(a, b) for a, b in zip(*grads))
    released = hook.wait_released(timeout=30)
    print(json.dumps({"same": same, "released": released, "pending": hook.pending()}))
    dist.destroy_process_group()
    """
)


@needs_gloo
def test_the_hook_gives_ddp_s_own_gradients_and_its_callbacks_are_all_released():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"same": True, "released": True, "pending": 0}
