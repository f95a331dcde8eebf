"""Correct: with gradient release each hook clips its own parameter; the whole-model clip runs only without release.

Reduced from kohya-ss/sd-scripts flux_train.py (same in flux_train_control_net.py, lumina_train.py,
sd3_train.py, sdxl_train.py). Under `--fused_backward_pass` (or `--blockwise_fused_optimizers`) every
parameter's post-accumulate-grad hook clips that one gradient and steps it (docs/gradient-release.md
accepts this); the clip over all parameters is under `if not (args.fused_backward_pass or ...)`, the
branch where nothing is released.
"""

import library.adafactor_fused
import torch
from accelerate import Accelerator


def train(args, training_models, flux, optimizer, optimizers, param_names, train_dataloader, lr_scheduler, loss_fn):
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
    flux = accelerator.prepare(flux)
    optimizer, train_dataloader, lr_scheduler = accelerator.prepare(optimizer, train_dataloader, lr_scheduler)

    if args.fused_backward_pass:
        library.adafactor_fused.patch_adafactor_fused(optimizer)
        for param_group, param_name_group in zip(optimizer.param_groups, param_names):
            for parameter, param_name in zip(param_group["params"], param_name_group):
                if parameter.requires_grad:

                    def create_grad_hook(p_name, p_group):
                        def grad_hook(tensor: torch.Tensor):
                            if accelerator.sync_gradients and args.max_grad_norm != 0.0:
                                accelerator.clip_grad_norm_(tensor, args.max_grad_norm)
                            optimizer.step_param(tensor, p_group)
                            tensor.grad = None

                        return grad_hook

                    parameter.register_post_accumulate_grad_hook(create_grad_hook(param_name, param_group))

    elif args.blockwise_fused_optimizers:
        for optimizer in optimizers:
            for param_group in optimizer.param_groups:
                for parameter in param_group["params"]:
                    if parameter.requires_grad:

                        def grad_hook(parameter: torch.Tensor):
                            if accelerator.sync_gradients and args.max_grad_norm != 0.0:
                                accelerator.clip_grad_norm_(parameter, args.max_grad_norm)
                            optimizer.step()
                            optimizer.zero_grad(set_to_none=True)

                        parameter.register_post_accumulate_grad_hook(grad_hook)

    for epoch in range(args.num_train_epochs):
        for m in training_models:
            m.train()
        for step, batch in enumerate(train_dataloader):
            with accelerator.accumulate(*training_models):
                loss = loss_fn(flux(batch["latents"]), batch["target"]).mean()
                accelerator.backward(loss)
                if not (args.fused_backward_pass or args.blockwise_fused_optimizers):
                    if accelerator.sync_gradients and args.max_grad_norm != 0.0:
                        params_to_clip = []
                        for m in training_models:
                            params_to_clip.extend(m.parameters())
                        accelerator.clip_grad_norm_(params_to_clip, args.max_grad_norm)

                    optimizer.step()
                    lr_scheduler.step()
                    optimizer.zero_grad(set_to_none=True)
                else:
                    lr_scheduler.step()
