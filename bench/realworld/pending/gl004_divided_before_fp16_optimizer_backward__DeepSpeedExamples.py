"""Correct: the loss is divided by the accumulation count before the fp16 optimizer's backward.

Reduced from microsoft/DeepSpeedExamples training/BingBertGlue/run_glue_classifier_bert_base.py
(same shape in run_glue_classifier_bert_large.py and training/bing_bert/). `optimizer` is an
apex/DeepSpeed FP16_Optimizer whose `backward(loss)` scales the already divided loss by the loss
scale and backpropagates: the division happened on the line that reassigns `loss`.
"""

import torch
from apex.optimizers import FP16_Optimizer, FusedAdam
from torch.nn import CrossEntropyLoss


def train(args, model, train_dataloader, num_labels, device):
    optimizer = FusedAdam(model.parameters(), lr=args.learning_rate, bias_correction=False)
    if args.fp16:
        optimizer = FP16_Optimizer(optimizer, dynamic_loss_scale=True)
    model.train()
    for _ in range(int(args.num_train_epochs)):
        for step, batch in enumerate(train_dataloader):
            input_ids, input_mask, segment_ids, label_ids = tuple(t.to(device) for t in batch)
            logits = model(input_ids, segment_ids, input_mask, labels=None)
            loss = CrossEntropyLoss()(logits.view(-1, num_labels), label_ids.view(-1))
            if args.gradient_accumulation_steps > 1:
                loss = loss / args.gradient_accumulation_steps
            if args.fp16:
                optimizer.backward(loss)
            else:
                loss.backward()
            if (step + 1) % args.gradient_accumulation_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
