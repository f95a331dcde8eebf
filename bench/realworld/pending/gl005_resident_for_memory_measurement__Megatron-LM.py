"""Correct: grad buffers are kept resident on purpose, to measure steady-state peak memory.

Reduced from NVIDIA/Megatron-LM tests/unit_tests/pipeline_parallel/test_fine_grained_activation_offloading.py
(_run_one_iter_and_capture and the warm-up / measurement loops). The test compares peak memory with
and without activation offloading; freeing the gradients between iterations would change the
footprint being measured, as the comments say.
"""

import torch


def measure_peak_memory(model, input_ids, num_warmup_iters=2, num_measure_iters=3):
    for _ in range(num_warmup_iters):
        loss = model(input_ids).float().sum()
        loss.backward()
        # Zero grads for next iteration
        for p in model.parameters():
            if p.grad is not None:
                p.grad.zero_()

    # Keep warmup-created grad buffers resident so the peak-memory check still
    # compares the steady-state allocator footprint.
    torch.cuda.reset_peak_memory_stats()
    for i in range(num_measure_iters):
        loss = model(input_ids).float().sum()
        loss.backward()
        if i < num_measure_iters - 1:
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.zero_()
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated())
