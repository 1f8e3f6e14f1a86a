"""The hidden checks' own plumbing: a pytest run that cannot reach the tool is an error, not a failure of the tool;
the Rust tests of an exercise are counted from its files."""

from __future__ import annotations

from pathlib import Path

from flakebot_magic.eval.hidden import run_pytest, rust_test_names
from flakebot_magic.eval.task import HiddenCheck, Task
from flakebot_magic.host.process import ProcessRunner


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


def test_rust_tests_are_counted_with_their_attributes(tmp_path: Path) -> None:
    source = tmp_path / "words.rs"
    source.write_text(
        "use words::*;\n\n#[test]\nfn first() {}\n\n#[test]\n#[ignore]\nfn second() {}\n\n"
        '#[test]\n#[should_panic(expected = "]")]\nfn third() { panic!("]") }\n\nfn helper() {}\n'
    )
    assert rust_test_names((source,)) == ["first", "second", "third"]
