"""The result cache and the parallel runner: a second run on an unchanged tree parses nothing."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import pytest
from click.testing import CliRunner

from fixture_markers import FIXTURES
from gradlint import cache as cache_module
from gradlint import linter, runner
from gradlint.cache import Cache
from gradlint.cli import main
from gradlint.config import Config

TRAINING = """import torch

model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x in data:
    model(x).sum().backward()
    opt.step()
"""


@pytest.fixture()
def parses(monkeypatch):
    """Count the files the runner parses."""
    seen: list[int] = []
    real = linter.parse  # the runner parses through linter.parse_and_check

    def counting(text, *tree):
        seen.append(len(text))
        return real(text, *tree)

    monkeypatch.setattr(linter, "parse", counting)
    return seen


@pytest.fixture()
def tree(tmp_path):
    for i in range(5):
        (tmp_path / f"train{i}.py").write_text(TRAINING.replace("lr=0.1", f"lr=0.{i + 1}"))
    (tmp_path / "utils.py").write_text("def helper():\n    return 1\n")
    return tmp_path


def findings_of(results):
    return [(r.path, r.error, [dataclasses.astuple(f) for f in r.findings]) for r in results]


def test_second_run_parses_nothing_and_answers_the_same(tree, parses):
    config = Config(root=tree)
    first = runner.run([str(tree)], config, jobs=1, cache=Cache(tree / ".gradlint_cache"))
    assert len(parses) == 5  # utils.py is skipped by the prefilter
    parses.clear()
    second_cache = Cache(tree / ".gradlint_cache")
    second = runner.run([str(tree)], config, jobs=1, cache=second_cache)
    assert parses == []
    assert second_cache.hits == 6
    assert findings_of(second) == findings_of(first)
    assert [f.code for r in second for f in r.findings] == ["GL001"] * 5


def test_a_changed_file_is_checked_again_alone(tree, parses):
    config = Config(root=tree)
    runner.run([str(tree)], config, jobs=1, cache=Cache(tree / ".gradlint_cache"))
    (tree / "train3.py").write_text(TRAINING.replace("opt.step()", "opt.step()\n    opt.zero_grad()"))
    parses.clear()
    results = runner.run([str(tree)], config, jobs=1, cache=Cache(tree / ".gradlint_cache"))
    assert len(parses) == 1
    assert {r.path.rsplit(os.sep, 1)[-1]: len(r.findings) for r in results}["train3.py"] == 0


def test_other_rules_or_another_gradlint_miss_the_cache(tree, parses, monkeypatch):
    runner.run([str(tree)], Config(root=tree), jobs=1, cache=Cache(tree / ".gradlint_cache"))
    parses.clear()
    runner.run([str(tree)], Config(root=tree, ignore=("GL005",)), jobs=1, cache=Cache(tree / ".gradlint_cache"))
    assert len(parses) == 5  # a different rule set is a different key
    parses.clear()
    monkeypatch.setattr(cache_module, "__version__", "999.0")
    runner.run([str(tree)], Config(root=tree), jobs=1, cache=Cache(tree / ".gradlint_cache"))
    assert len(parses) == 5
    assert len(list((tree / ".gradlint_cache").glob("results-*.json"))) == 1  # the old version's file is gone


def test_a_corrupt_cache_is_ignored(tree, parses):
    folder = tree / ".gradlint_cache"
    runner.run([str(tree)], Config(root=tree), jobs=1, cache=Cache(folder))
    [results_file] = folder.glob("results-*.json")
    results_file.write_text("{not json")
    parses.clear()
    results = runner.run([str(tree)], Config(root=tree), jobs=1, cache=Cache(folder))
    assert len(parses) == 5 and sum(len(r.findings) for r in results) == 5
    assert json.loads(results_file.read_text())  # rewritten whole


def cli(cwd, *args):
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(main, ["--isolated", *args])
    finally:
        os.chdir(old)


def test_cli_cache_folder_is_made_ignorable_and_no_cache_writes_nothing(tree):
    assert cli(tree, ".", "--no-cache").exit_code == 1
    assert not (tree / ".gradlint_cache").exists()
    assert cli(tree, ".").exit_code == 1
    assert (tree / ".gradlint_cache" / ".gitignore").read_text().splitlines()[-1] == "*"
    assert (tree / ".gradlint_cache" / "CACHEDIR.TAG").read_text().startswith("Signature: 8a477f597d28d172789f06886806bc55")
    assert cli(tree, ".", "--cache-dir", "elsewhere").exit_code == 1
    assert list((tree / "elsewhere").glob("results-*.json"))


def test_cli_cached_output_equals_uncached(tree):
    cold = cli(tree, ".", "--output-format", "json")
    warm = cli(tree, ".", "--output-format", "json")
    uncached = cli(tree, ".", "--output-format", "json", "--no-cache")
    assert cold.stdout == warm.stdout == uncached.stdout
    assert len(json.loads(cold.stdout)) == 5


@pytest.mark.parametrize("jobs", ["2", "3"])
def test_parallel_runs_match_one_job_in_the_same_order(tmp_path, monkeypatch, jobs):
    monkeypatch.setattr(runner, "MIN_PARALLEL_CHARS", 0)  # use the pool even for a small tree
    shutil.copytree(FIXTURES, tmp_path / "fixtures", ignore=shutil.ignore_patterns("fixed"))
    one = cli(tmp_path, "fixtures", "--no-cache", "-j", "1", "--select", "ALL")
    many = cli(tmp_path, "fixtures", "--no-cache", "-j", jobs, "--select", "ALL")
    assert one.exit_code == many.exit_code == 1
    assert one.stdout == many.stdout
    assert one.stdout.count("\n") > 20


def test_parallel_checking_really_uses_worker_processes(tree, monkeypatch):
    monkeypatch.setattr(runner, "MIN_PARALLEL_CHARS", 0)
    pids = []
    real = runner.check_text

    def recording(path, text, codes, context=()):
        pids.append(os.getpid())
        return real(path, text, codes, context)

    monkeypatch.setattr(runner, "check_text", recording)  # inherited by the forked workers
    results = runner.run([str(tree)], Config(root=tree), jobs=2)
    assert sum(len(r.findings) for r in results) == 5
    assert pids == []  # recorded in the workers, not here


def age(tree, seconds=60):
    """Make every file look written ``seconds`` ago, as on a tree nobody is editing."""
    for path in tree.glob("*.py"):
        stat = path.stat()
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns - seconds * 1_000_000_000))


def test_unchanged_old_files_are_not_even_read(tree, monkeypatch):
    age(tree)
    runner.run([str(tree)], Config(root=tree), jobs=1, cache=Cache(tree / ".gradlint_cache"))
    read = []
    real = runner.read_bytes
    monkeypatch.setattr(runner, "read_bytes", lambda path: read.append(path) or real(path))
    results = runner.run([str(tree)], Config(root=tree), jobs=1, cache=Cache(tree / ".gradlint_cache"))
    assert read == []
    assert sum(len(r.findings) for r in results) == 5


def test_a_file_changed_at_the_same_size_is_read_again(tree, monkeypatch, parses):
    age(tree)
    runner.run([str(tree)], Config(root=tree), jobs=1, cache=Cache(tree / ".gradlint_cache"))
    path = tree / "train2.py"
    fixed = path.read_text().replace("lr=0.3", "lr=1.0")  # same size, new time
    path.write_text(fixed)
    parses.clear()
    runner.run([str(tree)], Config(root=tree), jobs=1, cache=Cache(tree / ".gradlint_cache"))
    assert parses == [len(fixed)]


def test_a_young_file_is_always_read(tree, monkeypatch):
    """Two writes within one tick of the file system's clock must not hide a change: young files are never trusted by time."""
    runner.run([str(tree)], Config(root=tree), jobs=1, cache=Cache(tree / ".gradlint_cache"))
    read = []
    real = runner.read_bytes
    monkeypatch.setattr(runner, "read_bytes", lambda path: read.append(path) or real(path))
    runner.run([str(tree)], Config(root=tree), jobs=1, cache=Cache(tree / ".gradlint_cache"))
    assert len(read) == 6
