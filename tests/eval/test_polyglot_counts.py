"""What libtest ran is what counts: an exercise in the polyglot layout whose tests reuse names across modules and
files, sit behind a feature, and need support files (a data file, a ``tests/invalid/`` crate), run through
``flakebot eval --polyglot`` three ways: its reference solution (every test, each counted once), a wrong answer
(exactly the tests that fail), and a model that does nothing (its stub does not compile against the tests: the
model's failure). An exercise whose reference needs a crate the registry lacks is not runnable, out of the score.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from editscripts import TINYHEX, call, reply
from evalcli import eval_json
from scripted_builds import tiny_registry

from flakebot_magic.eval.polyglot import polyglot_suite
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.testing.fake_openai import FakeOpenAIServer

MARK = "zq-hidden-4417"
TESTS = f"""// {MARK}
use echoes::*;

const WORDS: &str = include_str!("data/words.txt");

#[test]
fn same() {{
    assert_eq!(echo("a"), "a");
}}

mod loud {{
    use echoes::*;

    #[test]
    #[ignore]
    fn same() {{
        assert_eq!(loud("a"), "A");
    }}
}}

mod quiet {{
    use echoes::*;

    #[test]
    #[ignore]
    fn same() {{
        assert_eq!(echo(super::WORDS.trim()), "zebra");
    }}
}}

#[test]
#[ignore]
fn hexes() {{
    assert_eq!(hex("a"), "61");
}}

#[test]
#[ignore]
fn invalid_cases_are_staged() {{
    let case = std::path::Path::new("tests/invalid/bad.rs");
    assert!(case.exists(), "{{:?}} does not exist.", case);
}}

#[cfg(feature = "extra")]
#[test]
fn gated() {{
    panic!("compiled only with the feature extra, which nothing turns on");
}}
"""
MORE = """use echoes::*;

#[test]
fn same() {
    assert_eq!(loud("b"), "B");
}
"""
STUB = (
    'pub fn echo(s: &str) -> String {\n    todo!("{s}")\n}\n\npub fn loud(s: &str) -> String {\n    todo!("{s}")\n}\n'
)
REFERENCE = (
    "pub fn echo(s: &str) -> String {\n    s.to_string()\n}\n\n"
    "pub fn loud(s: &str) -> String {\n    s.to_uppercase()\n}\n\n"
    "pub fn hex(s: &str) -> String {\n    tinyhex::to_hex(s.as_bytes())\n}\n"
)
#: loud() forgets to shout: loud::same and more.rs's same fail, the two other tests named same pass (hex by hand:
#: the model uses only the dependencies Cargo.toml lists)
WRONG = REFERENCE.replace("s.to_uppercase()", "s.to_lowercase()").replace(
    "tinyhex::to_hex(s.as_bytes())", 's.bytes().map(|b| format!("{b:02x}")).collect()'
)
#: the six tests libtest runs: the gated one is never compiled
RAN = {
    "tests/echoes.rs::same",
    "tests/echoes.rs::loud::same",
    "tests/echoes.rs::quiet::same",
    "tests/echoes.rs::hexes",
    "tests/echoes.rs::invalid_cases_are_staged",
    "tests/more.rs::same",
}


def _exercise(practice: Path, name: str, tests: dict[str, str], stub: str, example: str, cargo_example: str) -> Path:
    """An exercise as the benchmark lays one out; its config names the tests/*.rs files, not their support files."""
    root = practice / name
    named = sorted(path for path in tests if path.count("/") == 1 and path.endswith(".rs"))
    for relative, text in {
        ".docs/instructions.md": f"# Instructions\n\nEcho, shout and hex-encode text ({name}).\n",
        ".meta/example.rs": example,
        ".meta/Cargo-example.toml": cargo_example,
        ".meta/config.json": json.dumps({"files": {"solution": ["src/lib.rs"], "test": named}}),
        "Cargo.toml": f'[package]\nedition = "2021"\nname = "{name}"\nversion = "1.0.0"\n\n[features]\nextra = []\n',
        "src/lib.rs": stub,
        **tests,
    }.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    return root


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    practice = tmp_path / "polyglot-benchmark" / "rust" / "exercises" / "practice"
    _exercise(
        practice,
        "echoes",
        {
            "tests/echoes.rs": TESTS,
            "tests/more.rs": MORE,
            "tests/data/words.txt": "zebra\n",
            "tests/invalid/Cargo.toml": '[package]\nname = "echoes-invalid"\nversion = "0.0.0"\nedition = "2021"\n',
            "tests/invalid/bad.rs": "fn main() { let x: u8 = 300; }\n",
        },
        STUB,
        REFERENCE,
        '[package]\nedition = "2021"\nname = "echoes"\nversion = "0.0.0"\n\n[dependencies]\ntinyhex = "0.1"\n',
    )
    _exercise(
        practice,
        "needsmissing",
        {"tests/needsmissing.rs": "#[test]\nfn t() {\n    assert!(needsmissing::f());\n}\n"},
        "pub fn f() -> bool {\n    todo!()\n}\n",
        "pub fn f() -> bool {\n    nosuchcrate::yes()\n}\n",
        '[package]\nedition = "2021"\nname = "needsmissing"\nversion = "0.0.0"\n\n[dependencies]\nnosuchcrate = "1.2"\n',
    )
    return tmp_path / "polyglot-benchmark" / "rust"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DirectoryRegistry]:
    yield from tiny_registry(tmp_path_factory, [TINYHEX])


def test_the_hidden_check_stages_the_whole_tests_tree_and_the_reference_is_the_example(
    checkout: Path, tmp_path: Path
) -> None:
    suite = polyglot_suite(checkout, tmp_path / "staging")
    task = {t.id: t for t in suite.tasks}["echoes"]
    assert [p.name for p in task.hidden.files] == ["echoes.rs", "more.rs"]
    assert task.hidden.staged == (
        "tests/data/words.txt",
        "tests/echoes.rs",
        "tests/invalid/Cargo.toml",
        "tests/invalid/bad.rs",
        "tests/more.rs",
    )
    assert task.hidden.features == ()  # the exercise turns no feature on by default
    assert task.reference is not None and task.reference.files == (("src/lib.rs", ".meta/example.rs"),)
    assert task.reference.manifest == {"dependencies": {"tinyhex": "0.1"}}


def test_a_link_in_the_tests_tree_makes_the_exercise_a_problem_and_is_never_read(
    checkout: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("do not read")
    (checkout / "exercises" / "practice" / "echoes" / "tests" / "data" / "link.txt").symlink_to(secret)
    suite = polyglot_suite(checkout, tmp_path / "staging")
    (problem,) = [p for p in suite.problems if p.id == "echoes"]
    assert "tests/data/link.txt is a symlink" in problem.message


def _run(
    capsys: pytest.CaptureFixture[str], checkout: Path, registry: DirectoryRegistry, out: Path, *args: str
) -> tuple[int, dict[str, Any], str]:
    return eval_json(capsys, ["--polyglot", str(checkout), "--registry", str(registry.path), "--out", str(out), *args])


@pytest.mark.cargo
def test_the_reference_passes_every_test_libtest_ran_each_counted_once(
    checkout: Path, tmp_path: Path, registry: DirectoryRegistry, capsys: pytest.CaptureFixture[str]
) -> None:
    before = sorted(p.as_posix() for p in checkout.rglob("*"))
    code, data, err = _run(capsys, checkout, registry, tmp_path / "out", "--reference")
    assert code == 0, err
    (attempt,) = data["attempts"]
    assert attempt["task"] == "echoes" and attempt["passed"], attempt["message"]
    hidden = attempt["hidden"]
    assert set(hidden["tests"]) == RAN and set(hidden["tests"].values()) == {"passed"}
    assert (hidden["passed"], hidden["total"]) == (6, 6)
    # the exercise whose reference needs a crate the registry lacks: not runnable, out of the score, said so
    (unrunnable,) = data["suite"]["not_runnable"]
    assert unrunnable["task"] == "needsmissing"
    assert (
        unrunnable["problem"] == "not runnable: dependency nosuchcrate ^1.2 missing (the registry has no version of it)"
    )
    summary = data["models"][0]["summary"]
    assert (summary["pass_at_1"], summary["solved"], summary["tasks"]) == (1.0, 1, 1)
    assert data["reference"] and data["notice"].startswith("REFERENCE")
    assert "left out of the score: needsmissing: not runnable: dependency nosuchcrate" in err
    assert sorted(p.as_posix() for p in checkout.rglob("*")) == before  # the checkout is read, never written


@pytest.mark.cargo
def test_a_wrong_answer_fails_exactly_its_failing_tests_and_says_which_without_a_backtrace(
    checkout: Path,
    tmp_path: Path,
    registry: DirectoryRegistry,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RUST_BACKTRACE", "full")  # the caller's: it must not reach the hidden run
    script = [
        reply(call("write_file", path="src/lib.rs", content=WRONG), call("run_checks")),
        reply(call("finish", summary="echoes")),
    ]
    with FakeOpenAIServer(script) as server:
        code, data, err = _run(
            capsys, checkout, registry, tmp_path / "out", "--model", "scripted", "--base-url", server.base_url
        )
        requests = json.dumps(server.requests)
    assert code == 0, err
    attempt = {a["task"]: a for a in data["attempts"]}["echoes"]
    hidden = attempt["hidden"]
    assert (hidden["passed"], hidden["total"]) == (4, 6)
    failed = {key for key, outcome in hidden["tests"].items() if outcome != "passed"}
    assert failed == {"tests/echoes.rs::loud::same", "tests/more.rs::same"}
    assert (attempt["failure"], attempt["fault"]) == ("hidden-tests-failed", "model")
    assert attempt["message"].startswith("2 of 6 hidden tests failed; the first: tests/echoes.rs::loud::same")
    assert 'right: "A"' in attempt["cause"] and 'right: "A"' in attempt["message"]
    assert "stack backtrace" not in json.dumps(attempt)
    assert MARK not in requests  # the model never saw the hidden tests
    assert [a["task"] for a in data["attempts"]] == ["echoes"]  # needsmissing is not runnable: never attempted


@pytest.mark.cargo
def test_a_model_that_does_nothing_scores_zero_and_its_stub_not_compiling_is_its_own_failure(
    checkout: Path, tmp_path: Path, registry: DirectoryRegistry, capsys: pytest.CaptureFixture[str]
) -> None:
    with FakeOpenAIServer([reply(call("finish", summary="done"))] * 4) as server:
        code, data, err = _run(
            capsys, checkout, registry, tmp_path / "out", "--model", "scripted", "--base-url", server.base_url
        )
    assert code == 0, err
    attempt = {a["task"]: a for a in data["attempts"]}["echoes"]
    assert attempt["green"] and not attempt["passed"]
    assert (attempt["failure"], attempt["fault"]) == ("hidden-tests-compile", "model")
    assert "does not compile against the hidden tests" in attempt["message"] and "hex" in attempt["cause"]
    summary = data["models"][0]["summary"]
    assert (summary["pass_at_1"], summary["solved"], summary["tasks"]) == (0.0, 0, 1)
    assert summary["faults"] == {"model": 1}
    assert [p["task"] for p in data["suite"]["not_runnable"]] == ["needsmissing"]
