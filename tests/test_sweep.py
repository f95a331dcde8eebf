"""The join and the precision arithmetic of bench/sweep.py, on synthetic findings (no mirrors, no network)."""

import importlib.util
import sys
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location("bench_sweep", Path(__file__).resolve().parent.parent / "bench" / "sweep.py")
sweep = importlib.util.module_from_spec(_SPEC)
sys.modules["bench_sweep"] = sweep  # dataclasses look their module up while the class is built
_SPEC.loader.exec_module(sweep)


def _finding(path, line, code, text):
    return sweep.Finding("o/r", "c" * 40, path, line, code, text, "message")


def _verdict(path, code, text, verdict):
    return {"repository": "o/r", "commit": "c" * 40, "path": path, "code": code,
            "line_text": text, "verdict": verdict, "reason": "why"}


def test_verdicts_join_on_line_text_not_line_number():
    verdicts = sweep.load_verdicts([_verdict("train.py", "GL004", "loss.backward()", "false")])
    counts, untriaged = sweep.tally([_finding("train.py", 120, "GL004", "loss.backward()")], verdicts)
    assert counts["GL004"]["false"] == 1
    assert untriaged == []


def test_counts_and_precision_per_rule_and_overall():
    verdicts = sweep.load_verdicts([
        _verdict("a.py", "GL001", "opt.step()", "true"),
        _verdict("b.py", "GL001", "opt.step()", "true"),
        _verdict("c.py", "GL004", "loss.backward()", "false"),
    ])
    findings = [
        _finding("a.py", 3, "GL001", "opt.step()"),
        _finding("b.py", 9, "GL001", "opt.step()"),
        _finding("c.py", 5, "GL004", "loss.backward()"),
        _finding("d.py", 7, "GL004", "loss.backward()"),
    ]
    counts, untriaged = sweep.tally(findings, verdicts)
    assert sweep.precision(counts["GL001"]) == 1.0
    assert sweep.precision(counts["GL004"]) == 0.0
    assert counts["GL004"]["untriaged"] == 1
    assert sweep.precision(counts["all"]) == pytest.approx(2 / 3)
    assert [f.path for f in untriaged] == ["d.py"]
    table = sweep.markdown_table(counts)
    assert "| GL001 | 2 | 2 | 0 | 0 | 100% |" in table
    assert table.splitlines()[-1] == "| **all** | 4 | 2 | 1 | 1 | 67% |"


def test_precision_is_none_when_nothing_is_triaged():
    counts, _ = sweep.tally([_finding("a.py", 1, "GL005", "p.grad.zero_()")], {})
    assert sweep.precision(counts["GL005"]) is None
    assert "| GL005 | 1 | 0 | 0 | 1 | n/a |" in sweep.markdown_table(counts)


def test_a_verdict_other_than_true_or_false_is_refused():
    with pytest.raises(ValueError, match="true or false"):
        sweep.load_verdicts([_verdict("a.py", "GL001", "opt.step()", "maybe")])


def test_committed_verdicts_are_well_formed():
    rows = sweep.read_tsv(sweep.VERDICTS)
    verdicts = sweep.load_verdicts(rows)
    assert len(verdicts) == len(rows), "two verdict rows share a key"
    repositories = {row["repository"]: row["commit"] for row in sweep.read_tsv(sweep.REPOS)}
    for row in rows:
        assert repositories.get(row["repository"]) == row["commit"], row
        assert row["reason"].strip(), row


@pytest.mark.parametrize(("repos", "verdicts_file", "earlier"), [
    ("repos.tsv", "verdicts.tsv", ("bugfixes.tsv",)),
    ("repos-3.tsv", "verdicts-3.tsv", ("bugfixes.tsv", "bugfixes-2.tsv", "repos.tsv", "bugfixes-3.tsv")),
])
def test_the_held_out_repositories_are_pinned_and_kept_apart(repos, verdicts_file, earlier):
    """The held-out repositories are pinned, and none is in the sweep, the recall set or the held-out lists beside them."""
    held_out = sweep.HERE / "heldout"
    rows = sweep.read_tsv(held_out / repos)
    assert len(rows) >= 20
    for row in rows:
        assert len(row["commit"]) == 40 and int(row["commit"], 16) >= 0, row
        assert row["what"].strip(), row
    names = {row["repository"].lower() for row in rows}
    assert len(names) == len(rows)
    elsewhere = {row["repository"].lower() for row in sweep.read_tsv(sweep.REPOS)}
    elsewhere |= {row["repository"].lower() for row in sweep.read_tsv(sweep.HERE / "bugfixes.tsv")}
    for other in earlier:
        elsewhere |= {row["repository"].lower() for row in sweep.read_tsv(held_out / other)}
    assert not names & elsewhere
    verdicts = sweep.read_tsv(held_out / verdicts_file)
    assert len(sweep.load_verdicts(verdicts)) == len(verdicts)
    pinned = {row["repository"]: row["commit"] for row in rows}
    for row in verdicts:
        assert pinned.get(row["repository"]) == row["commit"] and row["reason"].strip(), row


def test_missing_mirrors_give_one_clear_error(tmp_path, capsys):
    assert sweep.main(["--mirrors", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("sweep: no git mirror under") and error.count("\n") == 1


@pytest.mark.parametrize("flag", ["--repos", "--verdicts"])
def test_a_missing_list_gives_one_clear_error(tmp_path, capsys, flag):
    assert sweep.main(["--mirrors", str(tmp_path), flag, str(tmp_path / "absent.tsv")]) == 2
    assert capsys.readouterr().err == f"sweep: no such file: {tmp_path / 'absent.tsv'}\n"


def test_the_repository_list_given_is_the_one_read(tmp_path, capsys):
    repos = tmp_path / "repos.tsv"
    repos.write_text(f"repository\tcommit\twhat\nother/repo\t{'b' * 40}\tw\n")
    verdicts = tmp_path / "verdicts.tsv"
    verdicts.write_text("\t".join(sweep.VERDICT_COLUMNS) + "\n")
    assert sweep.main(["--mirrors", str(tmp_path), "--repos", str(repos), "--verdicts", str(verdicts)]) == 2
    assert "for 1 of 1 repositories (other/repo)" in capsys.readouterr().err


def test_identical_lines_in_one_file_keep_their_own_verdicts(tmp_path):
    verdicts = sweep.load_verdicts([
        {**_verdict("t.py", "GL005", "p.grad.zero_()", "true"), "occurrence": "1"},
        {**_verdict("t.py", "GL005", "p.grad.zero_()", "false"), "occurrence": "2"},
    ])
    raw = [
        {"path": "t.py", "line": 9, "column": 5, "code": "GL005", "message": "m"},
        {"path": "t.py", "line": 3, "column": 5, "code": "GL005", "message": "m"},
    ]
    lines = ["p.grad.zero_()" if n in (3, 9) else "pass" for n in range(1, 10)]
    (tmp_path / "t.py").write_text("\n".join(lines) + "\n")
    findings = sweep.findings_of("o/r", "c" * 40, tmp_path, raw)
    assert [(f.line, f.occurrence) for f in findings] == [(3, 1), (9, 2)]
    counts, untriaged = sweep.tally(findings, verdicts)
    assert (counts["GL005"]["true"], counts["GL005"]["false"], untriaged) == (1, 1, [])


@pytest.mark.parametrize("layout", ["repo", "repo/.git", ""])
def test_a_mirror_is_found_bare_or_as_a_git_folder(tmp_path, layout):
    git_dir = tmp_path / "o+r" / layout
    git_dir.mkdir(parents=True)
    (git_dir / "HEAD").write_text("ref: refs/heads/main\n")
    assert sweep.mirror_of(tmp_path, "o/r") == git_dir
    assert sweep.mirror_of(tmp_path, "o/other") is None


def test_an_internal_error_stops_the_sweep_while_an_unparsable_file_does_not(tmp_path, monkeypatch):
    """Exit 2 is also a file that does not parse; an internal error of a rule would silently drop its file's
    findings from the counts, so the sweep stops on it."""
    import subprocess

    def fake_run(stderr):
        return lambda *args, **kwargs: subprocess.CompletedProcess(args, 2, stdout="[]", stderr=stderr)

    monkeypatch.setattr(sweep.subprocess, "run", fake_run("old.py: cannot parse: invalid syntax (line 3)\n"))
    assert sweep.run_gradlint(tmp_path, None) == []
    monkeypatch.setattr(sweep.subprocess, "run", fake_run("train.py: internal error in GL017: KeyError: 'x'\n"))
    with pytest.raises(RuntimeError, match="internal error in GL017"):
        sweep.run_gradlint(tmp_path, None)
