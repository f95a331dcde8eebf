"""Throughput of gradlint as ratios against a bare LibCST parse measured in the same run.

    python bench/throughput.py                 # offline, a few minutes on 2 cores
    python bench/throughput.py --download      # also the corpus of downloaded packages (about 15 minutes)

The default run needs no network. It reports, on one job and without a cache:

1. **shipped code**: ``gradlint check`` over ``fixtures/`` and ``examples/``
   (training scripts written like real ones) against ``libcst.parse_module``
   of the same files;
2. **growth**: one module of about 10,000, 50,000 and 100,000 lines made of
   that training code (the files concatenated, each file's top-level
   functions and classes renamed apart), checked against a bare parse of the
   same text at each size. The ratio stays flat when the cost grows no
   faster than the parser's;
3. **whole tree**: the installed ``torch`` package (any importable package
   with ``--tree``): gradlint with its prefilter against parsing every file.
   Parsing every file takes long, so it is timed on an evenly spaced sample
   (``--tree-sample``, 0 for every file) and scaled by characters: the
   output says so. Beside it, the floor of this design: Python's parse of
   every file (the project index reads every file of a package that holds
   a checked file) plus LibCST's parse of the files checked.

Times are CPU seconds of this process (``time.process_time``), the best of
``--repeat`` runs for the shipped code. ``--download`` adds the original
corpus run: the sources of a few real packages downloaded as wheels, compared
with ruff and TorchFix installed into a temporary folder. Nothing here is
asserted: the numbers go in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import gc
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import libcst as cst

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["transformers==5.23.0", "timm==1.0.31", "accelerate==1.15.0", "torchtune==0.6.1"]
RUFF = "ruff==0.17.5"
TORCHFIX = "torchfix==0.7.0"
SIZES = (10_000, 50_000, 100_000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="lines of the generated modules")
    parser.add_argument("--repeat", type=int, default=3, help="runs over the shipped code; the fastest counts")
    parser.add_argument("--tree", default="torch", help="an installed package whose whole tree is checked")
    parser.add_argument("--tree-sample", type=int, default=300, help="files of the tree parsed for the estimate (0: every file)")
    parser.add_argument("--download", action="store_true", help="also run the corpus of downloaded packages (network)")
    parser.add_argument("--packages", nargs="+", default=PACKAGES, help="with --download: pinned requirements whose sources form the corpus")
    parser.add_argument("--sample", type=int, default=300, help="with --download: files in the TorchFix comparison sample")
    parser.add_argument("--work", help="with --download: keep the downloads and the corpus here (default: a temporary folder)")
    parser.add_argument("--skip-torchfix", action="store_true")
    parser.add_argument("--skip-ruff", action="store_true")
    args = parser.parse_args()

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {sys.version.split()[0]}, libcst {cst_version()}", flush=True)
    shipped(args.repeat)
    growth(args.sizes)
    whole_tree(args.tree, args.tree_sample)
    if args.download:
        work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="gradlint-bench-"))
        try:
            run_download(args, work)
        finally:
            if not args.work:
                shutil.rmtree(work, ignore_errors=True)


def cst_version() -> str:
    from importlib.metadata import version

    return version("libcst")


def cpu_seconds(action: Callable[[], object], repeat: int = 1) -> float:
    """The best CPU time of ``repeat`` runs of ``action``."""
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        action()
        best = min(best, time.process_time() - start)
    return best


def parse_each(texts: list[str]) -> None:
    """``libcst.parse_module`` of every text; the ones it refuses are skipped, as gradlint reports them."""
    for text in texts:
        try:
            cst.parse_module(text)
        except Exception:  # noqa: BLE001
            pass


def shipped_files() -> list[Path]:
    return sorted([*ROOT.glob("fixtures/**/*.py"), *ROOT.glob("examples/*.py")])


def shipped(repeat: int) -> None:
    """Cold lint over the shipped training code against a bare parse of it."""
    from gradlint.config import Config
    from gradlint.runner import run

    files = shipped_files()
    texts = [path.read_text(encoding="utf-8") for path in files]
    lines = sum(text.count("\n") for text in texts)
    parse = cpu_seconds(lambda: parse_each(texts), repeat)
    lint = cpu_seconds(lambda: run([str(p) for p in files], Config(), jobs=1, cache=None), repeat)
    print(f"\n1. shipped code: {len(files)} files, {lines} lines (fixtures/, examples/)")
    print(f"   bare parse {parse:.2f} s, gradlint cold 1 job {lint:.2f} s: ratio {lint / parse:.2f}  (goal <= 1.5)", flush=True)


def training_module(lines: int) -> str:
    """About ``lines`` lines of training code: the shipped files one after another, repeated, names kept apart."""
    chunks = []
    for path in shipped_files():
        text = path.read_text(encoding="utf-8")
        try:
            compile(text, str(path), "exec")
        except SyntaxError:  # the fixtures of unreadable files
            continue
        chunks.append(re.sub(r"^from __future__ import .*\n", "", text, flags=re.M))
    out, count, copy = ["from __future__ import annotations\n"], 0, 0
    while count < lines:
        text = chunks[copy % len(chunks)]
        names = set(re.findall(r"^(?:async\s+)?(?:def|class)\s+(\w+)", text, flags=re.M))
        if names:  # each copy's helpers and classes get their own names, so calls still land in their own file's code
            pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(names))) + r")\b")
            text = pattern.sub(lambda m, n=copy: f"{m.group(1)}_{n}", text)
        out.append(text if text.endswith("\n") else text + "\n")
        count += text.count("\n") + (not text.endswith("\n"))
        copy += 1
    return "".join(out)


def growth(sizes: list[int]) -> None:
    """Lines per second of gradlint and of a bare parse on ever larger modules of training code."""
    from gradlint.linter import lint_text

    print("\n2. growth: one module of training code, checked with every default rule")
    print(f"   {'lines':>8} {'findings':>8} {'parse s':>8} {'lint s':>8} {'parse l/s':>10} {'lint l/s':>9} {'ratio':>6}")
    for size in sizes:
        text = training_module(size)
        lines = text.count("\n")
        parse = cpu_seconds(lambda: cst.parse_module(text))
        result = None

        def lint() -> None:
            nonlocal result
            result = lint_text(text, "generated.py")

        seconds = cpu_seconds(lint)
        assert result is not None and result.error is None, result and result.error
        print(
            f"   {lines:>8} {len(result.findings):>8} {parse:>8.2f} {seconds:>8.2f} {lines / parse:>10.0f} "
            f"{lines / seconds:>9.0f} {seconds / parse:>6.2f}",
            flush=True,
        )
    print("   (goal: ratio <= 1.5 at every size, so that the cost grows no faster than the parser's)")


def whole_tree(package: str, sample: int) -> None:
    """gradlint over an installed package tree, with its prefilter, against parsing every file of it."""
    from gradlint import runner
    from gradlint.config import Config
    from gradlint.runner import run

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        print(f"\n3. whole tree: package {package!r} is not installed: skipped")
        return
    tree = Path(list(spec.submodule_search_locations)[0])
    files = sorted(tree.rglob("*.py"))
    sizes = {path: path.stat().st_size for path in files}
    total_chars = sum(sizes.values())
    everything = dataclasses.replace(Config(), exclude=())  # the tree sits in a virtual environment, excluded by default
    results: list = []
    parsed: list[str] = []  # the files LibCST parsed: one job runs runner.check_text in this process for each
    real_check = runner.check_text

    def check_noted(path: str, *rest, **named):
        parsed.append(path)
        return real_check(path, *rest, **named)

    runner.check_text = check_noted
    try:
        lint = cpu_seconds(lambda: results.extend(run([str(tree)], everything, jobs=1, cache=None)))
    finally:
        runner.check_text = real_check
    chosen = files if sample <= 0 or sample >= len(files) else files[:: max(1, len(files) // sample)][:sample]
    texts = [path.read_text(encoding="utf-8", errors="replace") for path in chosen]
    parse = cpu_seconds(lambda: parse_each(texts))
    chosen_chars = sum(sizes[path] for path in chosen)
    estimated = parse * total_chars / chosen_chars
    how = "every file" if chosen is files else f"{len(chosen)}-file sample, scaled by characters to the {len(files)} files"
    # What no version of this design can skip: Python's parse of every file (the project index reads the loops of
    # every file of a package one of whose files is checked) and LibCST's parse of the files checked.
    every_text = [path.read_text(encoding="utf-8", errors="replace") for path in files]
    checked_texts = [Path(path).read_text(encoding="utf-8", errors="replace") for path in parsed]
    gc.collect()
    gc.disable()  # as gradlint parses: the collector would traverse the growing trees again and again
    try:
        python_parse = cpu_seconds(lambda: python_parse_each(every_text))
        checked_parse = cpu_seconds(lambda: parse_each(checked_texts))
    finally:
        gc.enable()
    floor = python_parse + checked_parse
    print(f"\n3. whole tree: {tree} ({len(files)} files, {total_chars / 1e6:.1f} MB; {len(results)} results, {len(parsed)} files parsed by LibCST)")
    print(f"   gradlint cold 1 job {lint:.1f} s; parsing every file {estimated:.1f} s ({how})")
    print(f"   parse everything / gradlint: {estimated / lint:.1f}x faster with the prefilter  (goal >= 10x)")
    print(
        f"   floor (collector off): Python's parse of every file {python_parse:.1f} s + LibCST's parse of the {len(parsed)} checked "
        f"{checked_parse:.1f} s = {floor:.1f} s: at best {estimated / floor:.1f}x; gradlint / floor {lint / floor:.2f}",
        flush=True,
    )


def python_parse_each(texts: list[str]) -> None:
    """``ast.parse`` of every text; the ones Python refuses are skipped."""
    for text in texts:
        try:
            ast.parse(text)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            pass


def run_download(args: argparse.Namespace, work: Path) -> None:
    """The ``--download`` mode: real packages' sources against ruff and TorchFix."""
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
        sample_gradlint = record("gradlint cold, 1 job, same sample", timed([*gradlint, "--no-cache", "-j", "1", str(sample)]), sample_lines)

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
