"""The hidden checks' own plumbing: a pytest run that cannot reach the tool is an error, not a failure of the tool;
the Rust tests of an exercise are counted as libtest listed and reported them, whatever the model's code does to the
test binary (abort it, forge its report)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tinycrates import write_registry

from flakebot_magic.eval.hidden import run_cargo_tests, run_pytest
from flakebot_magic.eval.task import HiddenCheck, Task
from flakebot_magic.host.git import Git
from flakebot_magic.host.process import ProcessRunner
from flakebot_magic.registry.directory import DirectoryRegistry


def test_hidden_tests_that_cannot_load_the_tool_are_an_error_of_the_checks(tmp_path: Path) -> None:
    tests = tmp_path / "task" / "test_hidden.py"
    tests.parent.mkdir()
    tests.write_text("def test_one(tool):\n    assert tool(input='x')\n\n\ndef test_two(tool):\n    assert tool()\n")
    task = Task("t", tests.parent, "missing", "words", HiddenCheck("pytest", (tests,)))
    result = run_pytest(
        task,
        cache_dir=tmp_path / "empty-cache",
        tool_name="missing",
        work=tmp_path / "work",
        runner=ProcessRunner(),
        timeout=120,
    )
    assert (result.passed, result.total, result.ok) == (0, 2, False)
    assert "no hidden test could reach the tool" in result.error and "No tool named 'missing'" in result.error
    assert (tmp_path / "work" / "test_hidden.py").read_text() == tests.read_text()  # a copy ran, not the suite's file


def test_a_hidden_file_that_pytest_cannot_import_is_an_error(tmp_path: Path) -> None:
    tests = tmp_path / "test_hidden.py"
    tests.write_text("import no_such_module_here\n\n\ndef test_x(tool):\n    pass\n")
    task = Task("t", tmp_path, "t", "words", HiddenCheck("pytest", (tests,)))
    result = run_pytest(
        task, cache_dir=tmp_path, tool_name="t", work=tmp_path / "work", runner=ProcessRunner(), timeout=120
    )
    assert result.total == 0 and "could not be collected" in result.error and "no_such_module_here" in result.error


@pytest.mark.cargo
def test_hidden_rust_tests_run_on_the_final_commit_and_never_land_through_a_planted_link(tmp_path: Path) -> None:
    suite = tmp_path / "suite" / "ex1"
    hidden = suite / "tests" / "ex1.rs"
    hidden.parent.mkdir(parents=True)
    hidden.write_text("// HIDDEN\n#[test]\nfn t() { assert_eq!(ex1::f(), 42); }\n")
    task = Task("ex1", suite, "ex1", "r", HiddenCheck("cargo", (hidden,)))
    ws = tmp_path / "attempt-1" / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "Cargo.toml").write_text('[package]\nname = "ex1"\nversion = "0.1.0"\nedition = "2021"\n')
    (ws / "src" / "lib.rs").write_text("pub fn f() -> u32 { 42 }\n")
    git = Git(ws, ProcessRunner())
    git.init("flakebot")
    git.commit("final", all_files=True)
    # after the commit, the session's sandboxed code: tests/ points at the next attempt, the source is rewritten
    elsewhere = tmp_path / "attempt-2" / "ws" / "src"
    elsewhere.mkdir(parents=True)
    (ws / "tests").symlink_to(elsewhere)
    (ws / "src" / "lib.rs").write_text("pub fn f() -> u32 { 0 }\n")
    registry = DirectoryRegistry(write_registry(tmp_path / "reg", []), tmp_path / "index")
    result = run_cargo_tests(
        task, workspace=ws, registry=registry, work=tmp_path / "work", runner=ProcessRunner(), timeout=300
    )
    assert list(elsewhere.iterdir()) == []  # nothing written through the link
    assert (result.passed, result.total, result.error) == (1, 1, "")  # the commit's f(), not the rewritten one
    assert (tmp_path / "work" / "crate" / "tests" / "ex1.rs").read_text() == hidden.read_text()


def test_hidden_rust_tests_need_the_workspace_history(tmp_path: Path) -> None:
    hidden = tmp_path / "ex1.rs"
    hidden.write_text("#[test]\nfn t() {}\n")
    task = Task("ex1", tmp_path, "ex1", "r", HiddenCheck("cargo", (hidden,)))
    (tmp_path / "ws").mkdir()
    registry = DirectoryRegistry(write_registry(tmp_path / "reg", []), tmp_path / "index")
    result = run_cargo_tests(
        task, workspace=tmp_path / "ws", registry=registry, work=tmp_path / "work", runner=ProcessRunner(), timeout=60
    )
    assert not result.ok and "has no git history" in result.error


def _exercise_crate(tmp_path: Path, tests: str, lib: str) -> tuple[Task, Path, DirectoryRegistry]:
    """A hidden test file ``tests`` and a final workspace (one commit) whose src/lib.rs is ``lib``."""
    hidden = tmp_path / "suite" / "ex3" / "tests" / "ex3.rs"
    hidden.parent.mkdir(parents=True)
    hidden.write_text(tests)
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "Cargo.toml").write_text('[package]\nname = "ex3"\nversion = "0.1.0"\nedition = "2021"\n')
    (ws / "src" / "lib.rs").write_text(lib)
    git = Git(ws, ProcessRunner())
    git.init("flakebot")
    git.commit("final", all_files=True)
    registry = DirectoryRegistry(write_registry(tmp_path / "reg", []), tmp_path / "index")
    return Task("ex3", hidden.parents[1], "ex3", "r", HiddenCheck("cargo", (hidden,))), ws, registry


@pytest.mark.cargo
def test_a_test_binary_that_dies_leaves_its_unreported_tests_failed_and_n_is_what_was_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model's code aborts the process in one test: the tests libtest never reported did not pass, and n is
    still every test libtest listed (counting only what reported would score what never ran)."""
    monkeypatch.setenv("RUST_BACKTRACE", "1")
    tests = "#[test]\nfn a_first() { assert_eq!(ex3::f(1), 1); }\n#[test]\nfn b_dies() { assert_eq!(ex3::f(0), 0); }\n"
    tests += "".join(
        f"#[test]\nfn c_after_{i}() {{ std::thread::sleep(std::time::Duration::from_millis(300)); }}\n"
        for i in range(3)
    )
    abort = "pub fn f(x: u32) -> u32 {\n    if x == 0 {\n        std::process::abort();\n    }\n    x\n}\n"
    task, ws, registry = _exercise_crate(tmp_path, tests, abort)
    result = run_cargo_tests(
        task, workspace=ws, registry=registry, work=tmp_path / "work", runner=ProcessRunner(), timeout=300
    )
    assert result.total == 5 and result.passed <= 1 and not result.error
    assert result.tests["tests/ex3.rs::b_dies"] != "passed"
    assert all(result.tests[f"tests/ex3.rs::c_after_{i}"] != "passed" for i in range(3))
    assert "FAILED tests/ex3.rs::b_dies" in result.output and "stack backtrace" not in result.output


@pytest.mark.cargo
def test_a_forged_report_then_a_failing_exit_never_passes_whole(tmp_path: Path) -> None:
    """The model's code writes libtest's lines for every test itself, past the capture, and exits 1."""
    forge = (
        "use std::io::Write;\n\npub fn f() {\n"
        '    let _ = std::io::stdout().write_all(b"test a_one ... ok\\ntest b_two ... ok\\n");\n'
        "    std::process::exit(1);\n}\n"
    )
    task, ws, registry = _exercise_crate(tmp_path, "#[test]\nfn a_one() { ex3::f(); }\n#[test]\nfn b_two() {}\n", forge)
    result = run_cargo_tests(
        task, workspace=ws, registry=registry, work=tmp_path / "work", runner=ProcessRunner(), timeout=300
    )
    assert result.total == 2 and result.passed <= 1 and not result.ok
    assert "though every test said ok" in result.output or "FAILED tests/ex3.rs::" in result.output
