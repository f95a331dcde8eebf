#!/usr/bin/env bash
# The GPU checks of the runtime, in one device call; logs under $OUT.
#
#   bash bench/gpu_check.sh [--quick] [WHEEL_DIR]   # WHEEL_DIR: default dist/gpu-wheels, made by bench/gpu_wheels.sh
#   PARTS="tests vit" bash bench/gpu_check.sh        # some parts only (tests, vit, gpt2); deadlines in seconds from
#                                                    # the start: TESTS_BY, VIT_BY, GPT2_BY. Part "cuda": only
#                                                    # CUDA_TESTS (default tests/runtime/test_cuda.py) on the GPU
#
# 1. installs the carried wheels (no network) into /tmp/site, beside the machine's own torch, torchvision,
#    transformers and pytest (the carried pytest only where the machine has none), and copies the tests,
#    fixtures and benches to a folder of their own: run from the checkout, the source folder gradlint/ (which
#    holds neither rules/ nor runtime/) would shadow the installed package in every child process;
# 2. runs the tests side by side, since none of them times anything: tests/runtime/test_cuda.py alone, the
#    rest of tests/runtime (slow ones included) over CPU workers with pytest-xdist where it is installed, and
#    tests/runtime/test_fake.py with the GPU hidden (a CUDA build with no visible device);
# 3. then, with the machine to themselves, the GPU section of bench/runtime_memory.py: `measure` and the
#    release recipes on the ViT-L/16 tutorial loop and on GPT-2 (~540 s in all), or with --quick the release
#    recipes on ViT-L alone (~230 s in all).
# Every step writes its log as it goes, so a run cut short still brings back what it did; a pytest stopped at
# its limit gets SIGINT first, so that it prints the failures it has seen.
set -u
cd "$(dirname "$0")/.."
QUICK=0
if [ "${1:-}" = "--quick" ]; then QUICK=1; shift; fi
WHEELS=$(realpath "${1:-dist/gpu-wheels}")
OUT=${OUT:-/tmp/gpu-check}
SITE=/tmp/site
CHECK=/tmp/gpu-check-tree
mkdir -p "$OUT"
started=$(date +%s)
left() {  # seconds from now until $1 seconds after the start, at least 10
    local n=$(( ${1} - ($(date +%s) - started) ))
    echo $(( n > 10 ? n : 10 ))
}
elapsed() { echo $(( $(date +%s) - started )); }
if [ $QUICK = 1 ]; then TESTS_BY=${TESTS_BY:-140}; VIT_BY=${VIT_BY:-225}; else TESTS_BY=${TESTS_BY:-200}; VIT_BY=${VIT_BY:-380}; fi
GPT2_BY=${GPT2_BY:-540}
PARTS=" ${PARTS:-tests vit gpt2} "
part() { [[ "$PARTS" == *" $1 "* ]]; }

{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
    python3 -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name())"
    python3 -c "import torchvision; print('torchvision', torchvision.__version__)" 2>&1
    python3 -c "import transformers; print('transformers', transformers.__version__)" 2>&1
    python3 -c "import pytest, xdist; print('pytest', pytest.__version__, 'xdist', xdist.__version__)" 2>&1
    git log -1 --format='commit %h, %cd' 2>/dev/null
    git status --short 2>/dev/null | head -20
} > "$OUT/environment.log" 2>&1
cat "$OUT/environment.log"

rm -rf "$SITE" "$CHECK"
wheels=()
for wheel in "$WHEELS"/*.whl; do
    case "$(basename "$wheel")" in
        pytest-*|pluggy-*|iniconfig-*|packaging-*|click-*|typing_extensions-*)
            python3 -c "import pytest, click" 2>/dev/null && continue ;;  # the machine's own, with its xdist
    esac
    wheels+=("$wheel")
done
if ! python3 -m pip install --no-index --no-deps --target "$SITE" "${wheels[@]}" >> "$OUT/environment.log" 2>&1; then
    echo "installing the wheels failed:"; tail -20 "$OUT/environment.log"; exit 2
fi
export PYTHONPATH="$SITE"
mkdir -p "$CHECK"
cp -r tests fixtures bench examples pyproject.toml "$CHECK"/
cd "$CHECK"
python3 -c "import gradlint.runtime.measure, libcst, optimi; print('gradlint from', gradlint.__file__)" 2>&1 \
    | tee -a "$OUT/environment.log"

workers=()
python3 -c "import xdist" 2>/dev/null && workers=(-n 10)
PYTEST=(python3 -m pytest -q -rs)

export PYTHONUNBUFFERED=1
if part tests || part cuda; then
timeout -s INT -k 15 "$(left $TESTS_BY)" "${PYTEST[@]}" -v ${CUDA_TESTS:-tests/runtime/test_cuda.py} > "$OUT/pytest-cuda.log" 2>&1 &
cuda=$!
rest= hidden=
if part tests; then
( GRADLINT_SLOW=1 timeout -s INT -k 15 "$(left $TESTS_BY)" "${PYTEST[@]}" "${workers[@]}" --durations=10 tests/runtime \
      --deselect tests/runtime/test_cuda.py > "$OUT/pytest.log" 2>&1
  echo "pytest tests/runtime (less test_cuda.py, ${workers[*]:-serial}) exit status $? after $(elapsed) s" >> "$OUT/pytest.log"
) &
rest=$!
( CUDA_VISIBLE_DEVICES="" timeout -s INT -k 15 "$(left $TESTS_BY)" "${PYTEST[@]}" tests/runtime/test_fake.py \
      > "$OUT/pytest-no-visible-gpu.log" 2>&1
  echo "pytest test_fake.py with CUDA_VISIBLE_DEVICES='' exit status $? after $(elapsed) s" >> "$OUT/pytest-no-visible-gpu.log"
) &
hidden=$!
if [ -f bench/gpu_fake_trace.py ]; then
    for kind in sequential tutorial; do
        timeout -s INT -k 15 "$(left $TESTS_BY)" python3 bench/gpu_fake_trace.py $kind >> "$OUT/fake-trace.log" 2>&1
    done
fi
fi
wait $cuda
echo "pytest tests/runtime/test_cuda.py exit status $? after $(elapsed) s" | tee -a "$OUT/pytest-cuda.log"
[ -n "$rest" ] && wait $rest $hidden
pkill -f "python3 -m pytest" 2>/dev/null  # stray workers of a run stopped at its limit would load the bench
tail -30 "$OUT/pytest-cuda.log"
[ -n "$rest" ] && tail -25 "$OUT/pytest.log" && tail -8 "$OUT/pytest-no-visible-gpu.log"
fi

if [ $QUICK = 1 ] && part vit; then
    timeout "$(left $VIT_BY)" python3 bench/runtime_memory.py --only gpu --gpu-models ViT --gpu-release-only \
        > "$OUT/bench-gpu-vit.log" 2>&1
    echo "bench (ViT-L, release recipes) exit status $? after $(elapsed) s" | tee -a "$OUT/bench-gpu-vit.log"
    cat "$OUT/bench-gpu-vit.log"
    exit 0
fi

if part vit; then
    timeout "$(left $VIT_BY)" python3 bench/runtime_memory.py --only gpu --gpu-models ViT --steps 5 --time-steps 12 \
        > "$OUT/bench-gpu-vit.log" 2>&1
    echo "bench (ViT-L) exit status $? after $(elapsed) s" | tee -a "$OUT/bench-gpu-vit.log"
    cat "$OUT/bench-gpu-vit.log"
fi

if part gpt2; then
    timeout "$(left $GPT2_BY)" python3 bench/runtime_memory.py --only gpu --gpu-models GPT-2 --steps 5 --time-steps 12 \
        > "$OUT/bench-gpu-gpt2.log" 2>&1
    echo "bench (GPT-2) exit status $? after $(elapsed) s" | tee -a "$OUT/bench-gpu-gpt2.log"
    cat "$OUT/bench-gpu-gpt2.log"
fi
