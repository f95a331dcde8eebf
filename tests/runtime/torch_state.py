"""What the runtime tests compare before and after tracing: torch's patchable entry points, and a loop using them all."""

from __future__ import annotations

import torch
from torch import nn


def train_everything(steps=6, accum=2, use_scaler=True):
    """A loop that touches every traced entry point: clear, scaled backward, unscale, clip, step, update, schedule."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt2 = torch.optim.AdamW(model[2].parameters(), lr=1e-3, foreach=False)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", enabled=use_scaler)
    data = torch.randn(steps * accum, 4, 6)
    for i in range(steps * accum):
        loss = model(data[i]).pow(2).mean() / accum
        scaler.scale(loss).backward()
        if (i + 1) % accum == 0:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            scaler.step(opt)
            scaler.update()
            opt2.step()
            sched.step()
            opt.zero_grad(set_to_none=(i % 4 == 1))
            model.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def torch_patch_points():
    """Every function and hook registry the tracer patches, as currently installed."""
    from torch.amp.grad_scaler import GradScaler
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.nn.utils import clip_grad
    from torch.optim import lr_scheduler, optimizer

    from gradlint.runtime.clipping import CLIPPING_FUNCTIONS

    return {
        "Tensor.backward": torch.Tensor.__dict__["backward"],
        "autograd.backward": torch.autograd.backward,
        "Optimizer.zero_grad": optimizer.Optimizer.__dict__["zero_grad"],
        "Optimizer.__init__": optimizer.Optimizer.__dict__["__init__"],
        "Module.zero_grad": nn.Module.__dict__["zero_grad"],
        "clip_grad_norm_": torch.nn.utils.clip_grad_norm_,
        "clip_grad.clip_grad_norm_": clip_grad.clip_grad_norm_,
        "clip_grad_value_": torch.nn.utils.clip_grad_value_,
        "clipping functions": {
            name: [c.cell_contents for c in getattr(clip_grad, attribute).__closure__ or ()]
            for name, attribute in CLIPPING_FUNCTIONS.items()
        },
        "GradScaler": {k: GradScaler.__dict__[k] for k in ("scale", "unscale_", "step", "update")},
        "LRScheduler.step": lr_scheduler.LRScheduler.__dict__["step"],
        "ReduceLROnPlateau.step": lr_scheduler.ReduceLROnPlateau.__dict__["step"],
        "DDP": (DDP.__dict__["forward"], DDP.__dict__["register_comm_hook"]),
        "pre_hooks": dict(optimizer._global_optimizer_pre_hooks),
        "post_hooks": dict(optimizer._global_optimizer_post_hooks),
    }
