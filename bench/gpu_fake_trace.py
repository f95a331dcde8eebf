"""Where a fake run's live bytes part from the real run's: both curves of one fixture script, side by side.

    python bench/gpu_fake_trace.py [KIND] [DEVICE]    # KIND of fixtures/run_device_scripts.py (sequential);
                                                      # DEVICE cuda (default; needs a GPU) or cpu

Prints both runs' tensor-meter reports, the CUDA allocator's figures, the
optimizers' kernels, and every point of the last measured step where the two
curves differ (the first 80). bench/gpu_check.sh runs it on the device.
"""
import os
import sys

from gradlint.runtime.measure import AS_WRITTEN, measure_mode

if __name__ == "__main__":
    kind = sys.argv[1] if len(sys.argv) > 1 else "sequential"
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "run_device_scripts.py")
    args = ["--kind", kind, "--device", sys.argv[2] if len(sys.argv) > 2 else "cuda"]
    real = measure_mode(script, AS_WRITTEN, args, steps=2, time_steps=0)
    fake = measure_mode(script, AS_WRITTEN, args, steps=2, fake=True)
    print(kind, "real", real.memory, "allocator", real.allocator_peak, real.allocator)
    print(kind, "fake", fake.memory, fake.device_story)
    print("kernels real", real.kernels, "fake", fake.kernels, "split real", real.memory.split)
    rt, ft = [(0, 0, live) for _, live in real.curve], [(0, 0, live) for _, live in fake.curve]
    print("curve lengths", len(rt), len(ft))
    shown = 0
    for i in range(max(len(rt), len(ft))):
        r = rt[i][2] if i < len(rt) else None
        f = ft[i][2] if i < len(ft) else None
        if r != f or i < 5:
            print(f"  op {i}: real {r} fake {f}")
            shown += 1
            if shown > 80:
                break
