"""The judge: structural scores, their order, and the cell's examples run against each candidate's binary (real cargo)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tinycrates import crate, write_registry

from flakebot_magic.edit.checkrun import CheckRun, CheckRunner
from flakebot_magic.edit.files import WorkspaceFiles
from flakebot_magic.edit.forks import clone_candidate
from flakebot_magic.edit.judge import Score, best, diff_lines, judge
from flakebot_magic.events import EventBus
from flakebot_magic.host.git import Git
from flakebot_magic.host.process import ProcessRunner
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.request import PersonText
from flakebot_magic.sandbox import Sandbox
from flakebot_magic.sandbox.cargo import Cargo
from flakebot_magic.stages.accept import split_request
from flakebot_magic.stages.fork import fork


def green(**parts: Any) -> Score:
    """A green candidate's score that meets the contract."""
    return Score(**{"contract_met": True, "green": True, **parts})


def test_scores_order_by_green_contract_examples_tests_clippy_then_diff() -> None:
    ladder = [
        Score(contract_met=False, examples_passed=9, tests_passed=9),
        Score(contract_met=True, examples_passed=9, tests_passed=9),  # not green
        green(examples_passed=0, examples_total=3, tests_passed=9),
        green(examples_passed=1, examples_total=3, tests_passed=1, clippy_warnings=0),
        green(examples_passed=1, examples_total=3, tests_passed=2, clippy_warnings=5, diff_lines=900),
        green(examples_passed=1, examples_total=3, tests_passed=2, clippy_warnings=1, diff_lines=900),
        green(examples_passed=1, examples_total=3, tests_passed=2, clippy_warnings=1, diff_lines=10),
    ]
    assert sorted(ladder, key=Score.key) == ladder
    assert len({s.key() for s in ladder}) == len(ladder)
    assert best(dict(enumerate(reversed(ladder)))) == 0


def test_best_breaks_ties_by_the_lower_index_and_needs_a_score() -> None:
    same = green(tests_passed=1)
    assert best({3: same, 1: same, 2: same}) == 1
    with pytest.raises(ValueError, match="no candidate"):
        best({})


def test_perfect_only_when_everything_is_met() -> None:
    assert green().perfect  # no examples to pass
    assert green(examples_passed=2, examples_total=2, tests_passed=4).perfect
    for flaw in (
        {"green": False},
        {"contract_met": False},
        {"examples_passed": 1},
        {"tests_failed": 1},
        {"clippy_warnings": 1},
    ):
        assert not green(**{"examples_passed": 2, "examples_total": 2, **flaw}).perfect, flaw
    assert green(diff_lines=10_000).perfect  # a big diff is only a tie-breaker


def test_describe_and_json() -> None:
    score = green(examples_passed=2, examples_total=3, tests_passed=5, clippy_warnings=1, diff_lines=12)
    assert score.describe() == "green · examples 2/3 · tests 5 passed · clippy 1 · diff 12 lines"
    broken = Score(contract_met=False, tests_failed=2, examples_total=1, note="examples not run")
    assert broken.describe() == (
        "not green · contract NOT met · examples 0/1 · tests 0 passed, 2 failed · clippy 0 · diff 0 lines "
        "(examples not run)"
    )
    data = score.to_json()
    assert data["perfect"] is False and data["examples_passed"] == 2 and data["diff_lines"] == 12
    assert Score(**{k: v for k, v in data.items() if k != "perfect"}) == score


def test_diff_lines_counts_added_and_removed_lines_between_two_commits(tmp_path: Path) -> None:
    git = Git(tmp_path, ProcessRunner())
    git.init("main")
    (tmp_path / "a.rs").write_text("one\ntwo\nthree\n")
    base = git.commit("base", all_files=True)
    assert base is not None
    (tmp_path / "a.rs").write_text("one\n2\nthree\nfour\n")  # 2 added, 1 removed
    (tmp_path / "new.rs").write_text("x\ny\n")  # 2 added
    (tmp_path / "blob.bin").write_bytes(b"\0\1\2")  # binary: one
    git.commit("edit", all_files=True)
    assert diff_lines(git, base) == 6
    assert diff_lines(git, base, base) == 0


# -- judging real candidates -------------------------------------------------------------------

JUDGEME_MAIN = """fn main() {
    let words: Vec<String> = std::env::args().skip(1).collect();
    println!("{}", shout(&words.join(" ")));
}

fn shout(text: &str) -> String {
    text.to_uppercase()
}

#[cfg(test)]
mod tests {
    #[test]
    fn shouts() {
        assert_eq!(super::shout("a"), "A");
    }
}
"""
JUDGEME = crate(
    "judgeme",
    manifest=(
        '[package]\nname = "judgeme"\nversion = "0.1.0"\nedition = "2021"\nlicense = "MIT"\n'
        'description = "Shout words"\n\n[package.metadata.flakebot]\nkind = "cli"\nbin = "judgeme"\n'
    ),
    files={"src/main.rs": JUDGEME_MAIN},
)
CELL = """Shout the words.
>>> judgeme("hi")
HI
>>> judgeme("a", "b")
A B
>>> judgeme("x")
nope
"""


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DirectoryRegistry]:
    root = write_registry(tmp_path_factory.mktemp("judgeregistry"), [JUDGEME])
    registry = DirectoryRegistry(root, tmp_path_factory.mktemp("judgeindex"))
    yield registry
    registry.close()


def _checked(path: Path, registry: DirectoryRegistry, iteration: int) -> CheckRun:
    """A check run in ``path``, committed (as the edit loop commits every run)."""
    runner = ProcessRunner()
    checks = CheckRunner(
        WorkspaceFiles(path),
        cargo=Cargo(registry, runner, Sandbox(path)),
        git=Git(path, runner),
        bus=EventBus([]),
        build_timeout=300,
        test_timeout=300,
    )
    run = checks.cargo_run(iteration, clippy=False)
    run.commit = checks.commit(run)
    return run


@pytest.mark.cargo
def test_the_judge_runs_the_examples_against_each_candidate_and_prefers_the_best(
    registry: DirectoryRegistry, tmp_path: Path
) -> None:
    runner = ProcessRunner()
    workspace = fork(
        registry.get("judgeme"),
        registry,
        tmp_path / "workspaces",
        "judgeme",
        runner=runner,
        bus=EventBus([]),
        cargo=Cargo(registry, runner),
    ).path
    base = _checked(workspace, registry, 0).commit
    _, examples = split_request(PersonText(CELL))
    assert len(examples) == 3
    plain, fixed, broken = (clone_candidate(workspace, i) for i in range(3))

    # 1: adds a special case (3 lines) and a test for it (4 lines and a blank one): every example passes
    main = fixed / "src" / "main.rs"
    main.write_text(
        JUDGEME_MAIN.replace(
            "fn shout(text: &str) -> String {\n",
            'fn shout(text: &str) -> String {\n    if text == "x" {\n        return "nope".to_string();\n    }\n',
        ).replace(
            "    #[test]\n    fn shouts()",
            '    #[test]\n    fn says_nope() {\n        assert_eq!(super::shout("x"), "nope");\n    }\n\n'
            "    #[test]\n    fn shouts()",
        )
    )
    # 2: does not build
    (broken / "src" / "main.rs").write_text(JUDGEME_MAIN.replace("text.to_uppercase()", "text.to_uppercase() +"))
    runs = {i: _checked(path, registry, 1) for i, path in enumerate((plain, fixed, broken))}
    assert [runs[i].green for i in range(3)] == [True, True, False]

    scores = {
        i: judge(runs[i], path, base, examples, git=Git(path, runner), name="judgeme")
        for i, path in enumerate((plain, fixed, broken))
    }
    assert scores[0] == Score(
        contract_met=True, examples_passed=2, examples_total=3, tests_passed=1, diff_lines=0, green=True
    )
    assert scores[1] == Score(
        contract_met=True, examples_passed=3, examples_total=3, tests_passed=2, diff_lines=8, green=True
    )
    assert not scores[2].green and scores[2].examples_passed == 0 and scores[2].examples_total == 3
    assert "not green" in scores[2].note
    assert scores[1].perfect and not scores[0].perfect and not scores[2].perfect
    assert scores[1].key() > scores[0].key() > scores[2].key()
    assert best(scores) == 1

    # without a name, the tool is called by its binary's name; a name the examples do not use fails them all
    assert judge(runs[1], fixed, base, examples, git=Git(fixed, runner)).examples_passed == 3
    assert judge(runs[1], fixed, base, examples, git=Git(fixed, runner), name="other").examples_passed == 0
