"""Buggy: the loss is scaled by a GradScaler but the optimizer steps directly, never unscaling.

Reduced from huggingface/accelerate benchmarks/fp8/ms_amp/non_distributed.py (train_baseline); ddp.py
has the same loop. accelerate's own MS-AMP path (accelerator.py: 'MS-AMP requires GradScaler even with
bf16 autocast') steps through `scaler.step(optimizer)` and `scaler.update()`; this baseline applies
gradients multiplied by the loss scale and skips the inf/NaN check.
"""

import msamp
import torch
from accelerate.utils import get_grad_scaler


def train_baseline(model, optimizer, train_dataloader, lr_scheduler, opt_level="O2"):
    model, optimizer = msamp.initialize(model, optimizer, opt_level=opt_level)
    model.to("cuda")
    model.train()
    scaler = get_grad_scaler()
    for batch in train_dataloader:
        batch = batch.to("cuda")
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            outputs = model(**batch)
        loss = outputs.loss
        loss = scaler.scale(loss)
        loss.backward()
        optimizer.step()  # expect: GL102
        optimizer.zero_grad()
        lr_scheduler.step()
