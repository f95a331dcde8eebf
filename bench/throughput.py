"""Throughput of gradlint on a large tree of real code, as ratios against baselines measured in the same run.

    python bench/throughput.py            # about 10-15 minutes on 2 cores

The corpus is the Python sources of a few real packages (downloaded as
wheels with ``pip download --no-deps`` into a temporary folder, no torch):
tens of thousands of lines of model, trainer and optimizer code, none of it
written for gradlint. The benchmark measures, each in a fresh process where
a tool runs:

- the floor: ``libcst.parse_module`` of every file, and of the files the
  prefilter lets through (the files gradlint must parse);
- gradlint cold (no cache, one job), without the prefilter, on every core,
  and warm (a second run on the unchanged tree with the cache);
- ruff with every rule on one thread (``RAYON_NUM_THREADS=1``), installed
  into the temporary folder;
- TorchFix (installed into the temporary folder with its own LibCST) and
  gradlint on the same fixed sample of files, since TorchFix needs about
  half an hour for the whole corpus on one core.

It prints one table: seconds, lines per second and the ratio each
comparison is about. Nothing here is asserted: the numbers go in the README.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

PACKAGES = ["transformers==5.23.0", "timm==1.0.31", "accelerate==1.15.0", "torchtune==0.6.1"]
RUFF = "ruff==0.17.5"
TORCHFIX = "torchfix==0.7.0"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--packages", nargs="+", default=PACKAGES, help="pinned requirements whose sources form the corpus")
    parser.add_argument("--sample", type=int, default=300, help="files in the TorchFix comparison sample")
    parser.add_argument("--work", help="keep the downloads and the corpus here (default: a temporary folder)")
    parser.add_argument("--skip-torchfix", action="store_true")
    parser.add_argument("--skip-ruff", action="store_true")
    args = parser.parse_args()

    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="gradlint-bench-"))
    try:
        run(args, work)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, work: Path) -> None:
    corpus = build_corpus(work, args.packages)
    files = sorted(corpus.rglob("*.py"))
    texts = {path: path.read_text(encoding="utf-8", errors="replace") for path in files}
    lines = sum(text.count("\n") for text in texts.values())
    print(f"corpus: {len(files)} files, {lines} lines from {', '.join(args.packages)}", flush=True)
    print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}", flush=True)

    rows: list[tuple[str, float, int]] = []

    def record(name: str, seconds: float, counted_lines: int) -> float:
        rows.append((name, seconds, counted_lines))
        print(f"  {name}: {seconds:.2f} s", flush=True)
        return seconds

    from gradlint.linter import might_fire
    from gradlint.rules import ALL_RULES

    default_rules = [rule for rule in ALL_RULES if rule.enabled_by_default]
    start = time.perf_counter()
    must_parse = [path for path, text in texts.items() if might_fire(text, default_rules)]
    prefilter_seconds = time.perf_counter() - start
    must_lines = sum(texts[p].count("\n") for p in must_parse)
    print(f"prefilter: {len(must_parse)} files ({must_lines} lines) must be parsed; the filter took {prefilter_seconds:.2f} s", flush=True)

    parse_all = record("libcst.parse_module, every file", parse_seconds(files), lines)
    parse_must = record("libcst.parse_module, files the prefilter passes", parse_seconds(must_parse), must_lines)
    checked = record("gradlint parse + model + rules, same files, in-process", check_seconds(must_parse), must_lines)

    gradlint = [sys.executable, "-m", "gradlint", "check", "--isolated", "--exit-zero", "--output-format", "json"]
    cold = record("gradlint cold, 1 job", timed([*gradlint, "--no-cache", "-j", "1", str(corpus)]), lines)
    no_prefilter = record("gradlint cold, 1 job, no prefilter", timed([*gradlint, "--no-cache", "-j", "1", "--no-prefilter", str(corpus)]), lines)
    cores = os.cpu_count() or 1
    parallel = record(f"gradlint cold, {cores} jobs", timed([*gradlint, "--no-cache", "-j", str(cores), str(corpus)]), lines)
    cache_dir = work / "cache"
    timed([*gradlint, "--cache-dir", str(cache_dir), "-j", "1", str(corpus)])  # fills the cache
    warm = record("gradlint warm (cache, unchanged tree)", timed([*gradlint, "--cache-dir", str(cache_dir), "-j", "1", str(corpus)]), lines)

    ruff = None
    if not args.skip_ruff:
        ruff_bin = install(work / "ruff", RUFF) / "bin" / "ruff"
        env = {**os.environ, "RAYON_NUM_THREADS": "1"}
        ruff_command = [str(ruff_bin), "check", "--select", "ALL", "--no-cache", "--isolated", "--exit-zero", "--quiet", str(corpus)]
        ruff = record("ruff check --select ALL, 1 thread", timed(ruff_command, env=env), lines)

    torchfix = sample_gradlint = None
    if not args.skip_torchfix:
        sample = make_sample(work, corpus, files, args.sample)
        sample_lines = sum(texts[corpus / p.relative_to(sample)].count("\n") for p in sorted(sample.rglob("*.py")))
        site = install(work / "torchfix", TORCHFIX)
        env = {**os.environ, "PYTHONPATH": str(site)}
        torchfix = record(f"TorchFix, 1 job, {args.sample}-file sample", timed([sys.executable, "-m", "torchfix", "-j", "1", str(sample)], env=env), sample_lines)
        sample_gradlint = record(f"gradlint cold, 1 job, same sample", timed([*gradlint, "--no-cache", "-j", "1", str(sample)]), sample_lines)

    print()
    print(f"{'measurement':<52} {'seconds':>9} {'lines':>10} {'lines/s':>10}")
    for name, seconds, counted in rows:
        print(f"{name:<52} {seconds:>9.2f} {counted:>10} {counted / seconds:>10.0f}")
    print()
    print("ratios (time / time; below 1 is faster):")
    print(f"  gradlint cold, 1 job / bare parse of the files it must parse: {cold / parse_must:.2f}  (target <= 1.5)")
    print(f"  ... of which per parsed file (parse + model + rules / parse):  {checked / parse_must:.2f}")
    print(f"  gradlint cold, 1 job / bare parse of every file:              {cold / parse_all:.3f}  (target <= 0.1)")
    print(f"  with prefilter / without prefilter:                           {cold / no_prefilter:.3f}")
    print(f"  {cores} jobs / 1 job:                                           {parallel / cold:.2f}")
    print(f"  warm / cold:                                                  {warm / cold:.3f}  (warm: {warm:.2f} s, target < 1 s)")
    if ruff is not None:
        print(f"  gradlint cold lines/s / ruff --select ALL lines/s:            {ruff / cold:.2f}  (target >= 1)")
    if torchfix is not None:
        print(f"  gradlint / TorchFix on the sample, time per line:             {sample_gradlint / torchfix:.3f}  (target < 1)")


def build_corpus(work: Path, packages: list[str]) -> Path:
    """Download the wheels (no dependencies, no torch) and keep only their Python files."""
    wheels = work / "wheels"
    corpus = work / "corpus"
    if corpus.is_dir():
        return corpus
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--dest", str(wheels), *packages],
        check=True,
    )
    for wheel in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.namelist():
                if member.endswith(".py") and ".dist-info/" not in member:
                    archive.extract(member, corpus)
    return corpus


def install(target: Path, requirement: str) -> Path:
    """``pip install --target``: a tool and its own dependencies, away from this environment."""
    if not target.is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target), requirement], check=True)
    return target


def make_sample(work: Path, corpus: Path, files: list[Path], size: int) -> Path:
    """Every n-th file of the sorted corpus, copied with its relative path: the same files each run."""
    sample = work / "sample"
    if sample.is_dir():
        shutil.rmtree(sample)
    step = max(1, len(files) // size)
    for path in files[::step][:size]:
        destination = sample / path.relative_to(corpus)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, destination)
    return sample


def parse_seconds(paths: list[Path]) -> float:
    """Seconds to ``libcst.parse_module`` these files, in a fresh process, reading them outside the timing."""
    listing = "\n".join(str(p) for p in paths)
    code = (
        "import sys, time, libcst\n"
        "texts = [open(p, encoding='utf-8', errors='replace').read() for p in sys.stdin.read().splitlines()]\n"
        "start = time.perf_counter()\n"
        "for text in texts:\n"
        "    try:\n"
        "        libcst.parse_module(text)\n"
        "    except Exception:\n"
        "        pass\n"
        "print(time.perf_counter() - start)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], input=listing, capture_output=True, text=True, check=True)
    return float(done.stdout.strip())


def check_seconds(paths: list[Path]) -> float:
    """Seconds for gradlint to parse and check these files (default rules) in a fresh process, reading outside the timing."""
    listing = "\n".join(str(p) for p in paths)
    code = (
        "import sys, time\n"
        "from gradlint.runner import check_text\n"
        "from gradlint.rules import ALL_RULES\n"
        "codes = tuple(r.code for r in ALL_RULES if r.enabled_by_default)\n"
        "items = [(p, open(p, encoding='utf-8', errors='replace').read()) for p in sys.stdin.read().splitlines()]\n"
        "start = time.perf_counter()\n"
        "for path, text in items:\n"
        "    check_text(path, text, codes)\n"
        "print(time.perf_counter() - start)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], input=listing, capture_output=True, text=True, check=True)
    return float(done.stdout.strip())


def timed(command: list[str], env: dict | None = None) -> float:
    """Wall-clock seconds of one run of ``command``, its output thrown away."""
    start = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    seconds = time.perf_counter() - start
    if done.returncode not in (0, 1, 2):  # 2: some files could not be checked, the run went on
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise SystemExit(f"{command[0]} failed ({done.returncode}): {tail}")
    return seconds


if __name__ == "__main__":
    main()
