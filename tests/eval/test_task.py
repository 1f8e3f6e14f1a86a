"""The task format: the starter suite reads clean; every kind of bad task is a problem with a clear message, never a
traceback, and the other tasks of its suite still load."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flakebot_magic.errors import UsageError
from flakebot_magic.eval.task import BUILTIN_SUITES, Task, TaskProblem, load_suite

ROOT = Path(__file__).resolve().parents[2]
STARTER = BUILTIN_SUITES["starter"]

GOOD_TOML = (
    'name = "echoer"\ncrate = "tinyhex"\nrequest = """\nEcho standard input.\n>>> echoer(input="a")\n\'a\'\n"""\n'
)
GOOD_TEST = "def test_echo(tool):\n    assert tool(input='x') == 'x'\n"


def _task(root: Path, name: str, toml: str | None = GOOD_TOML, test: str | None = GOOD_TEST, **files: str) -> Path:
    directory = root / name
    directory.mkdir(parents=True)
    if toml is not None:
        (directory / "task.toml").write_text(toml)
    if test is not None:
        (directory / "test_hidden.py").write_text(test)
    for file, text in files.items():
        (directory / file.replace("_json", ".json")).write_text(text)
    return directory


def test_the_starter_suite_has_about_twenty_tasks_each_with_hidden_tests_and_a_reference() -> None:
    suite = load_suite(STARTER)
    assert suite.problems == ()
    assert len(suite.tasks) >= 20
    registry = Path("/usr/share/cargo/registry")
    offline = {entry.name.rsplit("-", 1)[0] for entry in registry.iterdir()} if registry.is_dir() else set()
    for task in suite.tasks:
        assert task.hidden.kind == "pytest" and task.hidden.files[0].name == "test_hidden.py"
        assert task.reference is not None and task.crate, task.id
        assert not offline or task.crate in offline, f"{task.id}: {task.crate} is not in the offline registry"


def test_a_good_task_reads_as_written(tmp_path: Path) -> None:
    _task(tmp_path, "echo", toml=GOOD_TOML + "max_iterations = 3\ntoken_budget = 5000\ntimeout = 60\n")
    (task,) = load_suite(tmp_path).tasks
    assert isinstance(task, Task)
    assert (task.id, task.name, task.crate, task.max_iterations, task.token_budget, task.timeout) == (
        "echo",
        "echoer",
        "tinyhex",
        3,
        5000,
        60.0,
    )
    assert task.request.startswith("Echo standard input.\n>>> echoer")
    assert task.overrides() == {"max_iterations": 3, "token_budget": 5000}
    assert task.solution is None


BAD = {
    "not-toml": ("name = = 1\n", GOOD_TEST, "task.toml is not valid TOML"),
    "unknown-key": (GOOD_TOML + "model = 'x'\n", GOOD_TEST, "unknown key(s) model"),
    "no-name": ('request = "x"\n', GOOD_TEST, "missing name"),
    "bad-name": ('name = "not an identifier"\nrequest = "x"\n', GOOD_TEST, "name must be a Python identifier"),
    "empty-request": ('name = "t"\nrequest = "   "\n', GOOD_TEST, "request must be text"),
    "only-examples": ('name = "t"\nrequest = """\n>>> t()\n1\n"""\n', GOOD_TEST, "no words"),
    "bad-crate": ('name = "t"\nrequest = "x"\ncrate = 3\n', GOOD_TEST, "crate must be a crate's name"),
    "float-iterations": ('name = "t"\nrequest = "x"\nmax_iterations = 2.5\n', GOOD_TEST, "must be an integer"),
    "bool-budget": ('name = "t"\nrequest = "x"\ntoken_budget = true\n', GOOD_TEST, "must be an integer"),
    "zero-timeout": ('name = "t"\nrequest = "x"\ntimeout = 0\n', GOOD_TEST, "must be at least 1"),
    "no-tests-file": (GOOD_TOML, None, "test_hidden.py is missing"),
    "tests-syntax": (GOOD_TOML, "def test_x(tool):\n    assert (\n", "test_hidden.py line"),
    "no-test-in-file": (GOOD_TOML, "def helper():\n    pass\n", "defines no test"),
}


def test_every_bad_task_is_a_problem_and_the_good_one_still_runs(tmp_path: Path) -> None:
    _task(tmp_path, "good")
    for name, (toml, test, _) in BAD.items():
        _task(tmp_path, name, toml=toml, test=test)
    _task(tmp_path, "bad-solution", solution_json="{not json")
    _task(tmp_path, "scalar-solution", solution_json="42")
    _task(tmp_path, "no-task-file", toml=None)
    suite = load_suite(tmp_path)
    assert [t.id for t in suite.tasks] == ["good"]
    problems = {p.id: p.message for p in suite.problems}
    for name, (_, _, words) in BAD.items():
        assert words in problems[name], (name, problems[name])
    assert "solution.json is not valid JSON" in problems["bad-solution"]
    assert "fake-server script" in problems["scalar-solution"]
    assert "no task.toml" in problems["no-task-file"]
    assert all(isinstance(p, TaskProblem) and p.to_json()["problem"] for p in suite.problems)


def test_a_test_file_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.py"
    outside.write_text(GOOD_TEST)
    directory = _task(tmp_path / "suite", "linked", test=None)
    os.symlink(outside, directory / "test_hidden.py")
    (problem,) = load_suite(tmp_path / "suite").problems
    assert "not a regular file" in problem.message


def test_hidden_and_dot_directories_are_not_tasks(tmp_path: Path) -> None:
    _task(tmp_path, "good")
    _task(tmp_path, ".git", toml="broken = = =")
    _task(tmp_path, "_drafts", toml="broken = = =")
    suite = load_suite(tmp_path)
    assert [t.id for t in suite.tasks] == ["good"] and suite.problems == ()


def test_no_suite_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not a directory"):
        load_suite(tmp_path / "missing")
    with pytest.raises(UsageError, match="holds no task"):
        load_suite(tmp_path)


def test_only_some_tasks(tmp_path: Path) -> None:
    _task(tmp_path, "one")
    _task(tmp_path, "two")
    assert [t.id for t in load_suite(tmp_path).only(["two"]).tasks] == ["two"]
    with pytest.raises(UsageError, match="No task 'three'"):
        load_suite(tmp_path).only(["three"])
