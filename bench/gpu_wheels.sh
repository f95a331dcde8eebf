#!/usr/bin/env bash
# Build, on the CPU machine, the wheels bench/gpu_check.sh installs on a GPU machine that has no network.
#
#   bash bench/gpu_wheels.sh [PYTHON_VERSION]      # default 3.12, the GPU machine's Python
#
# Writes dist/gpu-wheels/: this project (pip wheel --no-deps .), libcst and PyYAML built for that Python on
# manylinux x86_64, and the pure-Python packages the runtime tests need beside torch (click, pytest and its
# dependencies, torch-optimi), at the versions of this checkout's .venv. Carry the folder to the device run:
# run(..., carry=["dist/gpu-wheels"]).
set -euo pipefail
cd "$(dirname "$0")/.."
PY_VERSION=${1:-3.12}
PIP=.venv/bin/pip
OUT=dist/gpu-wheels
rm -rf "$OUT"
mkdir -p "$OUT"
version() { .venv/bin/python -c "import importlib.metadata as m; print(m.version('$1'))"; }
$PIP wheel --quiet --no-deps -w "$OUT" .
$PIP download --quiet --no-deps --only-binary=:all: --python-version "$PY_VERSION" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    -d "$OUT" "libcst==$(version libcst)" "PyYAML==$(version PyYAML)"
for package in click pytest pluggy iniconfig packaging torch-optimi typing_extensions; do
    $PIP download --quiet --no-deps --only-binary=:all: -d "$OUT" "$package==$(version "$package")"
done
ls -l "$OUT"
du -sh "$OUT"
