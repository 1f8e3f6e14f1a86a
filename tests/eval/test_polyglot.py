"""The aider polyglot adapter, on exercises of our own in the benchmark's layout (none of aider's are copied here).

An exercise's instructions become the request, its Cargo.toml and src/ the starting crate (with the tool contract),
and its tests/*.rs run after the session with --include-ignored; the model never sees the tests nor .meta/.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from editscripts import TINYHEX, call, reply
from evalcli import eval_json
from scripted_builds import tiny_registry

from flakebot_magic.eval.polyglot import ExerciseRegistry, exercise_dirs, polyglot_suite
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.testing.fake_openai import FakeOpenAIServer

SEEN_NEVER = ("zq-example-5521", "zq-tests-9911")

REVERSE_TESTS = """// zq-tests-9911: the hidden tests of reverse-words
use reverse_words::*;

#[test]
fn one_word() {
    assert_eq!(reverse_words("hello"), "hello");
}

#[test]
#[ignore]
fn several_words() {
    assert_eq!(reverse_words("the quick brown fox"), "fox brown quick the");
}

#[test]
#[ignore]
fn empty() {
    assert_eq!(reverse_words(""), "");
}
"""
SHOUT_TESTS = """use shout::*;

#[test]
fn lower() {
    assert_eq!(shout("hey"), "HEY!");
}

#[test]
#[ignore]
fn already_loud() {
    assert_eq!(shout("HEY"), "HEY!");
}

#[test]
#[ignore]
fn empty_is_silence() {
    assert_eq!(shout(""), "");
}
"""


def _exercise(practice: Path, name: str, instructions: str, stub: str, tests: str) -> Path:
    root = practice / name
    (root / ".docs").mkdir(parents=True)
    (root / ".meta").mkdir()
    (root / "src").mkdir()
    (root / "tests").mkdir()
    (root / ".docs" / "instructions.md").write_text(f"# Instructions\n\n{instructions}\n")
    (root / ".docs" / "instructions.append.md").write_text("# Instructions append\n\nKeep it simple.\n")
    (root / ".meta" / "example.rs").write_text(f"// zq-example-5521: the reference solution\n{stub}")
    (root / ".meta" / "config.json").write_text(
        json.dumps(
            {
                "files": {
                    "solution": ["src/lib.rs", "Cargo.toml"],
                    "test": [f"tests/{name}.rs"],
                    "example": [".meta/example.rs"],
                },
                "blurb": instructions,
            }
        )
    )
    (root / "Cargo.toml").write_text(f'[package]\nedition = "2021"\nname = "{name}"\nversion = "1.0.0"\n')
    (root / "src" / "lib.rs").write_text(stub)
    (root / "tests" / f"{name}.rs").write_text(tests)
    return root


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """``rust/`` of a polyglot-benchmark checkout with two exercises of our own."""
    practice = tmp_path / "polyglot-benchmark" / "rust" / "exercises" / "practice"
    _exercise(
        practice,
        "reverse-words",
        "Reverse the order of the words in a sentence. >>> is not an example here.",
        'pub fn reverse_words(sentence: &str) -> String {\n    todo!("reverse {sentence}")\n}\n',
        REVERSE_TESTS,
    )
    _exercise(
        practice,
        "shout",
        "Shout: upper-case the text and add an exclamation mark; nothing to say stays silent.",
        'pub fn shout(text: &str) -> String {\n    todo!("shout {text}")\n}\n',
        SHOUT_TESTS,
    )
    return tmp_path / "polyglot-benchmark" / "rust"


def test_the_checkout_its_practice_dir_or_one_exercise(checkout: Path) -> None:
    practice = checkout / "exercises" / "practice"
    assert [p.name for p in exercise_dirs(checkout)] == ["reverse-words", "shout"]
    assert [p.name for p in exercise_dirs(practice)] == ["reverse-words", "shout"]
    assert [p.name for p in exercise_dirs(practice / "shout")] == ["shout"]
    assert exercise_dirs(checkout.parent) == []


def test_an_exercise_becomes_a_task_without_its_tests_or_reference_solution(checkout: Path, tmp_path: Path) -> None:
    suite = polyglot_suite(checkout, tmp_path / "staging")
    assert suite.problems == ()
    task = {t.id: t for t in suite.tasks}["reverse-words"]
    assert task.name == "reverse_words" and task.crate == "reverse-words" and task.origin == "polyglot"
    assert task.hidden.kind == "cargo" and [p.name for p in task.hidden.files] == ["reverse-words.rs"]
    assert "Reverse the order of the words" in task.request and "Keep it simple." in task.request
    assert ">>>" not in task.request  # prose, not an acceptance example
    assert "src/lib.rs declares" in task.request
    staged = task.source
    assert staged is not None
    files = sorted(p.relative_to(staged).as_posix() for p in staged.rglob("*") if p.is_file())
    assert files == ["Cargo.toml", "src/bin/reverse-words.rs", "src/lib.rs"]
    assert '[package.metadata.flakebot]\nkind = "cli"\nbin = "reverse-words"' in (staged / "Cargo.toml").read_text()
    for path in staged.rglob("*"):
        assert not path.is_file() or all(mark not in path.read_text() for mark in SEEN_NEVER)


def test_an_exercise_that_cannot_be_a_task_is_a_problem(checkout: Path, tmp_path: Path) -> None:
    practice = checkout / "exercises" / "practice"
    for test in (practice / "shout" / "tests").iterdir():
        test.unlink()
    (practice / "shout" / ".meta" / "config.json").write_text('{"files": {"solution": ["src/lib.rs"]}}')
    (practice / "reverse-words" / "tests" / "reverse-words.rs").unlink()
    _exercise(practice, "escapes", "Escape.", "pub fn f() {}\n", "#[test]\nfn t() {}\n")
    (practice / "escapes" / ".meta" / "config.json").write_text('{"files": {"test": ["../../../../etc/passwd"]}}')
    suite = polyglot_suite(checkout, tmp_path / "staging")
    problems = {p.id: p.message for p in suite.problems}
    assert suite.tasks == ()
    assert "no test files" in problems["shout"]
    assert "'tests/reverse-words.rs', which is missing" in problems["reverse-words"]
    assert "not a file inside the exercise" in problems["escapes"]


def test_the_exercise_registry_serves_exercises_and_leaves_the_rest_to_its_base(
    checkout: Path, tmp_path: Path, registry: DirectoryRegistry
) -> None:
    suite = polyglot_suite(checkout, tmp_path / "staging")
    wrapped = ExerciseRegistry(registry, suite.tasks)
    assert wrapped.get("shout").version == "1.0.0" and wrapped.get("tinyhex").name == "tinyhex"
    assert wrapped.path == registry.path and wrapped.cargo_config() == registry.cargo_config()
    fetched = wrapped.fetch(wrapped.get("shout"), tmp_path / "fork")
    assert (fetched.path / "src" / "lib.rs").is_file() and not (fetched.path / "tests").exists()


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DirectoryRegistry]:
    yield from tiny_registry(tmp_path_factory, [TINYHEX])


REVERSE = "pub fn reverse_words(sentence: &str) -> String {\n    sentence.split(' ').rev().collect::<Vec<_>>().join(\" \")\n}\n"
#: forgets that an exclamation mark needs something to say
SHOUT_WRONG = 'pub fn shout(text: &str) -> String {\n    format!("{}!", text.to_uppercase())\n}\n'


@pytest.mark.cargo
def test_exercises_run_through_the_edit_loop_and_their_rust_tests_judge_them(
    checkout: Path, tmp_path: Path, registry: DirectoryRegistry, capsys: pytest.CaptureFixture[str]
) -> None:
    script = [
        reply(call("write_file", path="src/lib.rs", content=REVERSE), call("run_checks")),
        reply(call("finish", summary="reverse_words done")),
        reply(call("write_file", path="src/lib.rs", content=SHOUT_WRONG), call("finish", summary="shout done")),
    ]
    before = sorted(p.as_posix() for p in checkout.rglob("*"))
    with FakeOpenAIServer(script) as server:
        args = ["--polyglot", str(checkout), "--model", "scripted", "--base-url", server.base_url]
        code, data, err = eval_json(capsys, [*args, "--registry", str(registry.path), "--out", str(tmp_path / "out")])
        requests = server.requests
    assert code == 0, err
    found = {a["task"]: a for a in data["attempts"]}
    # the ignored tests ran too (--include-ignored): 3 of 3, and 2 of 3 for the wrong shout
    assert found["reverse-words"]["passed"] and found["reverse-words"]["hidden"]["total"] == 3
    shout = found["shout"]
    assert shout["green"] and not shout["passed"] and shout["failure"] == "hidden-tests-failed"
    assert (shout["hidden"]["passed"], shout["hidden"]["total"]) == (2, 3) and "empty_is_silence" in shout["hidden"][
        "output"
    ]
    assert data["models"][0]["summary"]["pass_at_1"] == 0.5 and data["config"]["polyglot"] is True
    # the model read the instructions; never the tests, never the reference solution
    assert "Reverse the order of the words" in json.dumps(requests[0])
    assert all(mark not in json.dumps(body) for body in requests for mark in SEEN_NEVER)
    workspace = Path(found["reverse-words"]["workspace"])
    assert not (workspace / "tests").exists() and not (workspace / ".meta").exists()
    # the user's checkout is read, never written
    assert sorted(p.as_posix() for p in checkout.rglob("*")) == before
