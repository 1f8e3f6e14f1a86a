"""The task format: ``SUITE/TASK/task.toml``, ``test_hidden.py``, ``reference/`` and ``solution.json``, read and checked.

A suite is a directory of tasks, one directory each::

    SUITE/TASK/task.toml        name = "sha"; request = '''...'''  (optional: crate, max_iterations,
                                token_budget, timeout)
    SUITE/TASK/test_hidden.py   pytest checks the model never sees; fixture ``tool`` is the deployed tool
    SUITE/TASK/reference/       optional: the reference solution, as files laid over the crate
                                (``reference/Cargo.toml``: tables and keys added to the crate's manifest)
    SUITE/TASK/solution.json    optional: a script for the fake OpenAI-compatible server that solves it

:func:`load_suite` reads every task it finds. A task whose files are wrong
becomes a :class:`TaskProblem` with a message that says what to fix; it never
raises, and the other tasks still run. ``docs/eval.md`` is the reference.
"""

from __future__ import annotations

import ast
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..errors import UsageError
from ..host.fsutil import UnsafePath, is_real_dir, load_json, load_toml, read_inside
from ..host.names import is_tool_name
from ..request import PersonText, RequestText

__all__ = [
    "BUILTIN_SUITES",
    "HIDDEN_FILE",
    "MAX_FILE_BYTES",
    "REFERENCE_DIR",
    "SOLUTION_FILE",
    "TASK_FILE",
    "HiddenCheck",
    "Reference",
    "Suite",
    "Task",
    "TaskProblem",
    "load_suite",
    "load_task",
    "read_manifest",
    "reference_dir",
    "regular_files",
]

TASK_FILE = "task.toml"
#: suites that ship with flakebot, by name: ``flakebot eval starter`` works from any directory
BUILTIN_SUITES = {"starter": Path(__file__).resolve().parent / "suites" / "starter"}
HIDDEN_FILE = "test_hidden.py"
SOLUTION_FILE = "solution.json"
REFERENCE_DIR = "reference"
#: the keys a task.toml may hold, and whether each is required
_KEYS = {
    "name": True,
    "request": True,
    "crate": False,
    "max_iterations": False,
    "token_budget": False,
    "timeout": False,
}
#: a task file larger than this is not a task (a test file or a script of a few MB is plenty)
_MAX_FILE_BYTES = 8 * 1024 * 1024
#: the same cap, for the package's other readers of a suite (a reference's files, a hidden tree's)
MAX_FILE_BYTES = _MAX_FILE_BYTES
#: files one task may carry in its reference or its hidden tree
_MAX_FILES = 500


@dataclass(frozen=True)
class HiddenCheck:
    """The checks run against a task's result after its session; the model never sees them.

    ``pytest``: ``files`` is the task's ``test_hidden.py``, run with the
    fixture ``tool`` (the deployed tool's Python client). ``cargo``: ``files``
    are Rust integration tests (an aider polyglot exercise's ``tests/*.rs``),
    each run with ``cargo test --test STEM``; ``staged`` is every file they
    need (the whole ``tests/`` tree: support files, a ``tests/invalid/`` crate
    of compile-fail cases), relative to ``root``, added to a copy of the final
    workspace; ``features`` are those the task declares for the run.
    """

    kind: Literal["pytest", "cargo"]
    files: tuple[Path, ...]
    root: Path | None = None
    staged: tuple[str, ...] = ()
    features: tuple[str, ...] = ()


@dataclass(frozen=True)
class Reference:
    """A task's reference solution: files laid over the starting crate, and what it adds to ``Cargo.toml``.

    ``files`` maps a path in the crate (``src/bin/sha256.rs``) to the file's
    path under ``root`` (``reference/src/bin/sha256.rs``, or a polyglot
    exercise's ``.meta/example.rs``); ``manifest`` holds the tables and keys
    added to the crate's manifest (the tool contract, dependencies). The model
    never sees it: ``--reference`` applies it through the edit loop in place
    of a model, to prove that the task can be solved here and that the harness
    scores a right answer as right.
    """

    root: Path
    files: tuple[tuple[str, str], ...]
    manifest: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Task:
    """One task of a suite, checked.

    ``id`` is the task's directory name (unique in its suite); ``name`` the
    tool's name (what ``>>>`` examples and the hidden tests call it by).
    ``source`` is a starting crate of the task's own (a polyglot exercise),
    forked instead of a registry's ``crate``.
    """

    id: str
    path: Path
    name: str
    request: RequestText
    hidden: HiddenCheck
    crate: str | None = None
    max_iterations: int | None = None
    token_budget: int | None = None
    timeout: float | None = None
    solution: Path | None = None
    source: Path | None = None
    reference: Reference | None = None
    #: where the task comes from: ``flakebot`` (this format) or ``polyglot`` (an aider exercise)
    origin: str = "flakebot"

    def overrides(self) -> dict[str, Any]:
        """The build options this task sets (the command line's apply to the tasks that do not)."""
        return {
            key: value
            for key, value in (("max_iterations", self.max_iterations), ("token_budget", self.token_budget))
            if value is not None
        }


@dataclass(frozen=True)
class TaskProblem:
    """A task that cannot run as written: where it is and what to fix."""

    id: str
    path: Path
    message: str

    def to_json(self) -> dict[str, str]:
        return {"task": self.id, "path": str(self.path), "problem": self.message}


@dataclass(frozen=True)
class Suite:
    """The tasks of a suite that can run, the problems of those that are wrong, and those that cannot run here.

    ``unrunnable``: tasks written right that need what this machine lacks (a
    dependency's version the registry does not have, found by the preflight,
    :mod:`.preflight`): left out of every score, and counted where it shows.
    """

    path: Path
    tasks: tuple[Task, ...]
    problems: tuple[TaskProblem, ...] = field(default=())
    unrunnable: tuple[TaskProblem, ...] = field(default=())

    def only(self, ids: tuple[str, ...] | list[str]) -> Suite:
        """The suite with only the tasks ``ids`` (their problems too); an unknown id is a UsageError."""
        if not ids:
            return self
        known = {t.id for t in self.tasks} | {p.id for p in self.problems + self.unrunnable}
        unknown = sorted(set(ids) - known)
        if unknown:
            raise UsageError(
                f"No task {', '.join(map(repr, unknown))} in {self.path}. Its tasks: {', '.join(sorted(known))}."
            )
        return Suite(
            self.path,
            tuple(t for t in self.tasks if t.id in ids),
            tuple(p for p in self.problems if p.id in ids),
            tuple(p for p in self.unrunnable if p.id in ids),
        )


class _Bad(Exception):
    """A task file is wrong; the message says how."""


def load_suite(path: str | Path) -> Suite:
    """Every task under ``path`` (a directory of task directories, or a name of :data:`BUILTIN_SUITES`), checked.

    Raises only when ``path`` is no suite.

    Directories whose names start with ``.`` or ``_`` are skipped; a
    directory holding a ``test_hidden.py`` or ``solution.json`` but no
    ``task.toml`` is reported as a problem (a task with a typo in its file name).
    """
    root = Path(path).expanduser()
    if not root.is_dir() and str(path) in BUILTIN_SUITES:
        root = BUILTIN_SUITES[str(path)]
    if not root.is_dir():
        raise UsageError(
            f"The suite {root} is not a directory. Give the directory that holds the task directories, "
            f"or a built-in suite: {', '.join(sorted(BUILTIN_SUITES))}."
        )
    tasks: list[Task] = []
    problems: list[TaskProblem] = []
    for entry in sorted(root.iterdir()):
        if entry.name.startswith((".", "_")):
            continue
        if entry.is_symlink() and entry.is_dir():  # a suite's files are read, never followed (issue 33)
            problems.append(TaskProblem(entry.name, entry, "it is a symlink: a suite's tasks are read, never followed"))
            continue
        if not is_real_dir(entry):
            continue
        if not (entry / TASK_FILE).is_file():
            if (entry / HIDDEN_FILE).exists() or (entry / SOLUTION_FILE).exists():
                problems.append(TaskProblem(entry.name, entry, f"it has no {TASK_FILE} (name = ..., request = ...)"))
            continue
        found = load_task(entry)
        if isinstance(found, Task):
            tasks.append(found)
        else:
            problems.append(found)
    if not tasks and not problems:
        raise UsageError(
            f"The suite {root} holds no task: a task is a directory with a {TASK_FILE} and a {HIDDEN_FILE} "
            "(see docs/eval.md)."
        )
    return Suite(root, tuple(tasks), tuple(problems))


def load_task(directory: Path) -> Task | TaskProblem:
    """The task in ``directory``, or the problem that keeps it from running."""
    try:
        return _task(directory)
    except _Bad as exc:
        return TaskProblem(directory.name, directory, str(exc))


def _task(directory: Path) -> Task:
    data = _toml(directory / TASK_FILE)
    unknown = sorted(set(data) - set(_KEYS))
    if unknown:
        raise _Bad(f"{TASK_FILE}: unknown key(s) {', '.join(unknown)}; a task has {', '.join(_KEYS)}")
    missing = [key for key, required in _KEYS.items() if required and key not in data]
    if missing:
        raise _Bad(f"{TASK_FILE}: missing {', '.join(missing)}")
    name = data["name"]
    if not is_tool_name(name):
        raise _Bad(f"{TASK_FILE}: name must be a Python identifier (the tool's name), not {name!r}")
    request = data["request"]
    if not isinstance(request, str) or not request.strip():
        raise _Bad(f"{TASK_FILE}: request must be text: what the tool should do, then optional >>> examples")
    from ..errors import UsageError
    from ..stages.accept import split_request  # the pipeline's own reading of a cell (loads the tool clients)

    # a suite file the person chose to run: its words are theirs, and its ">>>" examples checks
    request = PersonText(request.strip())
    try:
        words, examples = split_request(request, name=name)
    except UsageError as exc:
        raise _Bad(f"{TASK_FILE}: {exc}") from None
    if not words:
        raise _Bad(f"{TASK_FILE}: the request has >>> examples but no words saying what the tool should do")
    if ">>>" in request and not examples:
        raise _Bad(
            f"{TASK_FILE}: the request's >>> examples could not be read (doctest format: '>>> call', then output)"
        )
    crate = data.get("crate")
    if crate is not None and (not isinstance(crate, str) or not crate.strip()):
        raise _Bad(f"{TASK_FILE}: crate must be a crate's name, not {crate!r}")
    hidden = directory / HIDDEN_FILE
    _check_tests(hidden)
    solution = directory / SOLUTION_FILE
    if solution.exists():
        _check_json(solution)
    reference = None
    if os.path.lexists(directory / REFERENCE_DIR):
        try:
            reference = reference_dir(directory, REFERENCE_DIR)
        except ValueError as exc:
            raise _Bad(str(exc)) from None
    return Task(
        id=directory.name,
        path=directory,
        name=name,
        request=request,
        hidden=HiddenCheck("pytest", (hidden,)),
        crate=crate.strip() if crate else None,
        max_iterations=_number(data, "max_iterations", int, 1),
        token_budget=_number(data, "token_budget", int, 1),
        timeout=_number(data, "timeout", float, 1),
        solution=solution if solution.exists() else None,
        reference=reference,
    )


def regular_files(root: Path, relative: str) -> list[str]:
    """Every regular file under ``root/relative`` (a directory), as paths relative to ``root``, sorted.

    The walk never follows a link: a symlink, a FIFO or a device anywhere in
    the tree is a ``ValueError`` naming it (a checkout's links are not read,
    whatever they point at), as are more than :data:`_MAX_FILES` files.
    """
    found: list[str] = []
    pending = [relative]
    while pending:
        current = pending.pop()
        try:
            entries = list(os.scandir(root / current))
        except OSError as exc:
            raise ValueError(f"{current}/ cannot be read: {exc.strerror}") from None
        for entry in entries:
            path = f"{current}/{entry.name}"
            if entry.is_symlink() or not (entry.is_dir(follow_symlinks=False) or entry.is_file(follow_symlinks=False)):
                raise ValueError(f"{path} is a symlink or a special file (a checkout's links are never followed)")
            if entry.is_dir(follow_symlinks=False):
                pending.append(path)
            else:
                found.append(path)
        if len(found) > _MAX_FILES:
            raise ValueError(f"{relative}/ holds more than {_MAX_FILES} files")
    return sorted(found)


def reference_dir(directory: Path, relative: str) -> Reference:
    """The reference solution in ``directory/relative``: its files, its ``Cargo.toml`` read as the manifest's additions."""
    if not stat.S_ISDIR(os.lstat(directory / relative).st_mode):
        raise ValueError(f"{relative} must be a directory of files laid over the crate, not a symlink or a file")
    files = regular_files(directory, relative)
    if not files:
        raise ValueError(f"{relative}/ is empty: it holds the files of the reference solution")
    manifest: dict[str, Any] = {}
    laid: list[tuple[str, str]] = []
    for path in files:
        inside = path[len(relative) + 1 :]
        if inside == "Cargo.toml":
            manifest = read_manifest(directory, path)
        else:
            laid.append((inside, path))
    return Reference(directory, tuple(laid), manifest)


def read_manifest(root: Path, relative: str) -> dict[str, Any]:
    """The TOML file ``relative`` under ``root``, read without following a link (``ValueError`` says what is wrong)."""
    try:
        data, more = read_inside(root, relative, MAX_FILE_BYTES)
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{relative} cannot be read: {exc}") from None
    if more:
        raise ValueError(f"{relative} is larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB")
    try:
        return load_toml(text)
    except ValueError as exc:
        raise ValueError(f"{relative} is not valid TOML: {exc}") from None


def _read(path: Path) -> str:
    """A task file, read without following a symlink (at the file, or a directory on the way) or blocking."""
    try:
        data, more = read_inside(path.parent, path.name, _MAX_FILE_BYTES)
    except (UnsafePath, FileNotFoundError):
        raise _Bad(f"{path.name} is missing (or not a regular file: a symlink is never followed)") from None
    except OSError as exc:
        raise _Bad(f"{path.name} cannot be read: {exc.strerror or exc}") from None
    if more:
        raise _Bad(f"{path.name} is larger than {_MAX_FILE_BYTES // (1024 * 1024)} MiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Bad(f"{path.name} cannot be read as UTF-8 text: {exc}") from None


def _toml(path: Path) -> dict[str, Any]:
    try:
        return load_toml(_read(path))
    except ValueError as exc:
        raise _Bad(f"{path.name} is not valid TOML: {exc}") from None


def _check_tests(path: Path) -> None:
    text = _read(path)
    try:
        tree = ast.parse(text, filename=str(path))
    except SyntaxError as exc:
        raise _Bad(f"{path.name} line {exc.lineno}: {exc.msg}") from None
    tests = [
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")
    ]
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name.startswith("Test")]
    if not tests and not classes:
        raise _Bad(f"{path.name} defines no test (a function named test_..., taking the fixture `tool`)")


def _check_json(path: Path) -> None:
    try:
        data = load_json(_read(path))
    except ValueError as exc:
        raise _Bad(f"{path.name} is not valid JSON: {exc}") from None
    if not isinstance(data, Mapping | list):
        raise _Bad(f'{path.name} must be a fake-server script: {{"responses": [...]}} or a list of replies')


def _number(data: Mapping[str, Any], key: str, kind: type[int] | type[float], low: float) -> Any:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or (kind is int and isinstance(value, float)):
        raise _Bad(f"{TASK_FILE}: {key} must be {'an integer' if kind is int else 'a number'}, not {value!r}")
    if value < low:
        raise _Bad(f"{TASK_FILE}: {key} must be at least {low:g}, not {value!r}")
    return kind(value)
