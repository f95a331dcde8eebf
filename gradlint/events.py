"""The event vocabulary shared by the static loop model and the runtime tracer.

The static model says which of these events *can* happen in a loop, in
program order; the runtime tracer records which *did*. Rules and the
runtime's confirmations are both written against these names.
"""

from __future__ import annotations

import enum


class EventKind(str, enum.Enum):
    """What a statement does to gradients, optimizers, scalers or schedulers."""

    ZERO = "ZERO"  # gradients cleared: opt.zero_grad(), model.zero_grad(), p.grad = None
    BACKWARD = "BACKWARD"  # loss.backward(), scaler.scale(loss).backward(), accelerator.backward(loss)
    STEP = "STEP"  # opt.step(), scaler.step(opt)
    UNSCALE = "UNSCALE"  # scaler.unscale_(opt)
    CLIP = "CLIP"  # torch.nn.utils.clip_grad_norm_ / clip_grad_value_
    SCALER_UPDATE = "SCALER_UPDATE"  # scaler.update()
    SCHED_STEP = "SCHED_STEP"  # lr_scheduler.step()

    def __str__(self) -> str:
        return self.value
