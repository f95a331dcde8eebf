"""DDP's stock all-reduce as a comm hook whose callbacks can be waited for before the interpreter exits.

The tracer counts DDP's all-reduces through a comm hook. Like torch's own
``allreduce_hook``, each bucket's result comes from ``Future.then(callable)``.
The process group's worker thread runs the callable, completes the bucket's
future (the main thread wakes and goes on), and only then drops the callable,
which takes the GIL again (torch's ``PythonFunctionGuard`` destructor). On a
loaded machine that worker can wait for the GIL until the interpreter is
finalizing: CPython then ends the thread with ``pthread_exit``, whose unwinding
through that ``noexcept`` destructor calls ``std::terminate`` ("terminate
called without an active exception", SIGABRT) after the script's output is
complete. Seen in a core dump of a rank of the distributed tests: the worker in
``ProcessGroupGloo::runLoop`` -> ``finishWorkGloo`` -> ``~PythonFunctionGuard``
-> ``take_gil`` -> ``PyThread_exit_thread``, the main thread in ``Py_FinalizeEx``.
``destroy_process_group`` does not end those worker threads.
"""

from __future__ import annotations

import time
import weakref
from typing import Any


class WaitableAllreduce:
    """``allreduce_hook`` (divide by the group's size, sum-all-reduce), keeping track of its callbacks."""

    def __init__(self) -> None:
        # (callback, the all-reduce's own future): a callback is released once
        # the worker thread that completed that future has let go of it
        self._pending: list[tuple[weakref.ref, Any]] = []

    # No annotations: DDP accepts only dist.GradBucket / Future[Tensor] there, or none.
    def __call__(self, process_group, bucket):  # type: ignore[no-untyped-def]
        import torch.distributed as dist

        group = process_group if process_group is not None else dist.group.WORLD
        tensor = bucket.buffer()
        tensor.div_(group.size())  # before the sum, as torch's hook does (fp16 overflow)

        def first_tensor(fut: Any) -> Any:
            return fut.value()[0]

        reduced = dist.all_reduce(tensor, group=group, async_op=True).get_future()
        self._pending = [(callback, fut) for callback, fut in self._pending if callback() is not None]
        self._pending.append((weakref.ref(first_tensor), reduced))
        return reduced.then(first_tensor)

    def wait_released(self, timeout: float = 30.0) -> bool:
        """Wait until every callback of a finished all-reduce has been dropped; ``False`` on timeout.

        Sleeping releases the GIL to the worker threads that still hold one.
        All-reduces that never finished (a peer died) are not waited for.
        """
        deadline = time.monotonic() + timeout
        while any(callback() is not None and fut.done() for callback, fut in self._pending):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)
        self._pending = []
        return True

    def pending(self) -> int:
        """How many callbacks are still held by the process group's threads."""
        return sum(1 for callback, _ in self._pending if callback() is not None)
