#!/usr/bin/env bash
# The GPU checks of the runtime, in one device call of under ~8 minutes; logs under $OUT.
#
#   bash bench/gpu_check.sh [WHEEL_DIR]      # default dist/gpu-wheels, made by bench/gpu_wheels.sh
#
# 1. installs the carried wheels (no network) into /tmp/site, beside the machine's own torch, torchvision
#    and transformers;
# 2. runs, each within what is left of ~500 s: tests/runtime/test_cuda.py, the GPU section of
#    bench/runtime_memory.py on the ViT-L/16 tutorial loop, the rest of tests/runtime (the CUDA tests run
#    there; nothing is skipped for want of a GPU), then the bench on GPT-2.
# Every step writes its log as it goes, so a run cut short still brings back what it did.
set -u
cd "$(dirname "$0")/.."
WHEELS=${1:-dist/gpu-wheels}
OUT=${OUT:-/tmp/gpu-check}
SITE=/tmp/site
mkdir -p "$OUT"
started=$(date +%s)
left() {  # seconds from now until $1 seconds after the start, at least 10
    local n=$(( ${1} - ($(date +%s) - started) ))
    echo $(( n > 10 ? n : 10 ))
}

{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
    python3 -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name())"
    python3 -c "import torchvision; print('torchvision', torchvision.__version__)" 2>&1
    python3 -c "import transformers; print('transformers', transformers.__version__)" 2>&1
    git log -1 --format='commit %h, %cd' 2>/dev/null
} > "$OUT/environment.log" 2>&1
cat "$OUT/environment.log"

rm -rf "$SITE"
if ! python3 -m pip install --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl > "$OUT/install.log" 2>&1; then
    echo "installing the wheels failed:"; tail -20 "$OUT/install.log"; exit 2
fi
export PYTHONPATH="$SITE"
# -P: the repository's own folders are not on sys.path; gradlint is the installed wheel
python3 -P -c "import gradlint.runtime.measure, libcst, optimi; print('gradlint from', gradlint.__file__)" | tee -a "$OUT/install.log"

# most telling first: the CUDA tests, the tutorial loop's bench, then the rest of the runtime tests, then GPT-2
timeout "$(left 120)" python3 -P -m pytest tests/runtime/test_cuda.py -q -p no:cacheprovider -rs > "$OUT/pytest-cuda.log" 2>&1
echo "pytest tests/runtime/test_cuda.py exit status $? after $(( $(date +%s) - started )) s" | tee -a "$OUT/pytest-cuda.log"
tail -15 "$OUT/pytest-cuda.log"

timeout "$(left 270)" python3 -P bench/runtime_memory.py --only gpu --gpu-models ViT --steps 5 --time-steps 12 \
    > "$OUT/bench-gpu-vit.log" 2>&1
echo "bench (ViT-L) exit status $? after $(( $(date +%s) - started )) s" | tee -a "$OUT/bench-gpu-vit.log"
cat "$OUT/bench-gpu-vit.log"

timeout "$(left 430)" python3 -P -m pytest tests/runtime -q -p no:cacheprovider -rs --durations=10 \
    --deselect tests/runtime/test_cuda.py > "$OUT/pytest.log" 2>&1
echo "pytest tests/runtime (less test_cuda.py) exit status $? after $(( $(date +%s) - started )) s" | tee -a "$OUT/pytest.log"
tail -25 "$OUT/pytest.log"

timeout "$(left 500)" python3 -P bench/runtime_memory.py --only gpu --gpu-models GPT-2 --steps 5 --time-steps 12 \
    > "$OUT/bench-gpu-gpt2.log" 2>&1
echo "bench (GPT-2) exit status $? after $(( $(date +%s) - started )) s" | tee -a "$OUT/bench-gpu-gpt2.log"
cat "$OUT/bench-gpu-gpt2.log"
