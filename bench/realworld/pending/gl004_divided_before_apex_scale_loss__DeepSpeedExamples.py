"""Correct: the loss is divided by the accumulation count before apex's amp.scale_loss wraps it.

Reduced from microsoft/DeepSpeedExamples training/BingBertSquad/nvidia_run_squad_baseline.py.
`amp.scale_loss(loss, optimizer)` yields `loss * loss_scale` of the loss it is given, which was
already divided by `gradient_accumulation_steps` two lines earlier.
"""

import torch
from apex import amp


def train(args, model, optimizer, train_dataloader, device):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2")
    model.train()
    for step, batch in enumerate(train_dataloader):
        input_ids, input_mask, segment_ids, start_positions, end_positions = tuple(t.to(device) for t in batch)
        loss = model(input_ids, segment_ids, input_mask, start_positions, end_positions)
        if args.gradient_accumulation_steps > 1:
            loss = loss / args.gradient_accumulation_steps
        if args.fp16:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        if (step + 1) % args.gradient_accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
