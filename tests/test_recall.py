"""The matching and the recall arithmetic of bench/recall.py, on synthetic findings (no mirrors, no network)."""

import importlib.util
import re
import sys
from collections import Counter
from pathlib import Path

import pytest

from gradlint.rules import RULES_BY_CODE

_BENCH = Path(__file__).resolve().parent.parent / "bench"
_SPEC = importlib.util.spec_from_file_location("bench_recall", _BENCH / "recall.py")
recall = importlib.util.module_from_spec(_SPEC)
sys.modules["bench_recall"] = recall  # dataclasses look their module up while the class is built
_SPEC.loader.exec_module(recall)


def _bug(line=40, expected="GL003", path="train.py"):
    return recall.Bug("o/r", "f" * 40, path, line, expected, "what", "https://example.org/pr/1")


def _finding(line, code="GL003", path="train.py", message="m"):
    return {"path": path, "line": line, "column": 9, "code": code, "message": message}


def test_a_finding_within_the_window_is_a_match_and_one_beyond_is_not():
    bug = _bug(line=40)
    assert recall.nearest_match(bug, [_finding(40 + recall.WINDOW)])["line"] == 43
    assert recall.nearest_match(bug, [_finding(40 - recall.WINDOW)])["line"] == 37
    assert recall.nearest_match(bug, [_finding(40 + recall.WINDOW + 1)]) is None
    assert recall.nearest_match(bug, [_finding(40 - recall.WINDOW - 1)]) is None


def test_a_finding_whose_message_names_the_buggy_line_is_a_match_however_far():
    bug = _bug(line=307)
    far = _finding(577, message="`optimizer` steps at line 307 and is never cleared")
    assert recall.nearest_match(bug, [far])["line"] == 577
    assert recall.nearest_match(bug, [_finding(577, message="steps at line 3070 and at line 30")]) is None
    assert recall.nearest_match(bug, [_finding(577, code="GL004", message="line 307")]) is None
    assert recall.nearest_match(bug, [far, _finding(309)])["line"] == 309  # a finding near the line comes first


def test_the_code_and_the_file_must_both_match():
    bug = _bug(line=40, expected="GL003", path="pkg/train.py")
    assert recall.nearest_match(bug, [_finding(40, code="GL001", path="pkg/train.py")]) is None
    assert recall.nearest_match(bug, [_finding(40, code="GL003", path="pkg/other.py")]) is None
    assert recall.nearest_match(bug, [_finding(40, code="GL003", path="./pkg/train.py")])["line"] == 40


def test_the_nearest_of_several_findings_is_chosen():
    match = recall.nearest_match(_bug(line=40), [_finding(43), _finding(39), _finding(42)])
    assert match["line"] == 39


def test_a_bug_no_rule_covers_is_never_found():
    assert recall.nearest_match(_bug(expected="none"), [_finding(40, code="none")]) is None


def test_a_finding_left_on_the_fixed_code_is_told_apart_from_one_the_fix_removed(tmp_path):
    (tmp_path / "train.py").write_text("for x in data:\n    opt.zero_grad()\n    loss.backward()\n")
    fixed = [_finding(2)]
    assert recall.persists(_bug(), "opt.zero_grad()", tmp_path, fixed)
    assert not recall.persists(_bug(), "model.zero_grad()", tmp_path, fixed)
    assert not recall.persists(_bug(), "opt.zero_grad()", tmp_path, [])


def test_counts_recall_per_rule_and_overall():
    outcomes = [
        recall.Outcome(_bug(expected="GL001"), 12, "opt.step()", True),
        recall.Outcome(_bug(expected="GL001"), None),
        recall.Outcome(_bug(expected="GL004"), 30, "loss.backward()", False),
        recall.Outcome(_bug(expected="none"), None),
    ]
    counts = recall.tally(outcomes)
    assert (counts["GL001"]["bugs"], counts["GL001"]["found"]) == (2, 1)
    assert (counts["all"]["bugs"], counts["all"]["found"], counts["all"]["gone"]) == (4, 2, 1)
    table = recall.markdown_table(counts).splitlines()
    assert "| GL001 | 2 | 1 | 50% | 1 of 1 |" in table
    assert "| GL004 | 1 | 1 | 100% | 0 of 1 |" in table
    assert table[-2] == "| none (no rule) | 1 | 0 | 0% | 0 of 0 |"
    assert table[-1] == "| **all** | 4 | 2 | 50% | 1 of 2 |"


def test_the_scope_is_the_top_level_folder_or_the_root_alone():
    assert recall.scope_of("src/pkg/train.py") == ("src", True)
    assert recall.scope_of("train.py") == ("", False)


def test_a_malformed_row_is_refused():
    row = {"repository": "o/r", "fix_commit": "abc123", "path": "t.py", "line": "3",
           "expected": "GL001", "what": "w", "source": "s"}
    with pytest.raises(ValueError, match="malformed"):
        recall.load_bugs([row])


def test_committed_bugfixes_are_well_formed():
    bugs = recall.load_bugs(recall.read_tsv(recall.BUGFIXES))
    assert len(bugs) >= 15
    for bug in bugs:
        assert re.fullmatch(r"[0-9a-f]{40}", bug.fix_commit), bug
        assert bug.expected == "none" or re.fullmatch(r"GL\d{3}", bug.expected), bug
        assert bug.source.startswith("https://github.com/"), bug
    assert {bug.expected for bug in bugs} - {"none"} <= set(RULES_BY_CODE)


_HELD_OUT = recall.BUGFIXES.parent / "heldout"


@pytest.mark.parametrize(("batch", "earlier", "min_bugs", "min_repositories"), [
    ("bugfixes.tsv", (), 30, 20),
    ("bugfixes-2.tsv", ("bugfixes.tsv", "repos.tsv"), 25, 15),
    ("bugfixes-3.tsv", ("bugfixes.tsv", "repos.tsv", "bugfixes-2.tsv", "repos-3.tsv"), 25, 15),
])
def test_the_held_out_bugs_are_well_formed_and_kept_apart(batch, earlier, min_bugs, min_repositories):
    """A held-out batch is kept out of the sets the rules are tuned on (the recall set, the sweep) and out of the held-out lists before it."""
    bugs = recall.load_bugs(recall.read_tsv(_HELD_OUT / batch))
    assert len(bugs) >= min_bugs
    for bug in bugs:
        assert re.fullmatch(r"[0-9a-f]{40}", bug.fix_commit), bug
        assert bug.expected == "none" or bug.expected in RULES_BY_CODE, bug
        assert bug.source.startswith("https://github.com/"), bug
    per_repository = Counter(bug.repository for bug in bugs)
    assert len(per_repository) >= min_repositories and max(per_repository.values()) <= 3
    tuned = {bug.repository.lower() for bug in recall.load_bugs(recall.read_tsv(recall.BUGFIXES))}
    tuned |= {row["repository"].lower() for row in recall.read_tsv(recall.BUGFIXES.parent / "repos.tsv")}
    for earlier_list in earlier:
        tuned |= {row["repository"].lower() for row in recall.read_tsv(_HELD_OUT / earlier_list)}
    assert not {name.lower() for name in per_repository} & tuned


def test_missing_mirrors_give_one_clear_error(tmp_path, capsys):
    assert recall.main(["--mirrors", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("recall: no git mirror under") and error.count("\n") == 1


def test_a_missing_bug_list_gives_one_clear_error(tmp_path, capsys):
    assert recall.main(["--mirrors", str(tmp_path), "--bugfixes", str(tmp_path / "absent.tsv")]) == 2
    error = capsys.readouterr().err
    assert error == f"recall: no bug list at {tmp_path / 'absent.tsv'}\n"


def test_the_bug_list_given_is_the_one_read(tmp_path, capsys):
    bugs = tmp_path / "bugs.tsv"
    bugs.write_text("repository\tfix_commit\tpath\tline\texpected\twhat\tsource\n"
                    f"other/repo\t{'a' * 40}\ttrain.py\t3\tGL001\tw\thttps://github.com/other/repo/pull/1\n")
    assert recall.main(["--mirrors", str(tmp_path), "--bugfixes", str(bugs)]) == 2
    error = capsys.readouterr().err
    assert "for 1 of 1 repositories (other/repo)" in error


def test_a_buggy_file_that_does_not_parse_is_told_apart(tmp_path):
    (tmp_path / "old.py").write_text("def train(:\n    pass\n")
    (tmp_path / "new.py").write_text("def train():\n    pass\n")
    (tmp_path / "py36.py").write_text("x = y.cuda(async=True)\n")  # gradlint reads it through a stand-in
    assert recall.parse_error_of(tmp_path / "old.py") == "does not parse: invalid syntax (line 1, column 11)"
    assert recall.parse_error_of(tmp_path / "new.py") == ""
    assert recall.parse_error_of(tmp_path / "py36.py") == ""
    assert recall.parse_error_of(tmp_path / "absent.py") == "file not extracted"
