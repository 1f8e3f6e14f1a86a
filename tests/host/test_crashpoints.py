"""The crash points are the code's: every change on disk in the watched functions is followed by one, each is named once.

``tests/manage/test_transaction.py`` kills real builds at every point of
:data:`~flakebot_magic.host.crashpoints.POINTS`; this file keeps that list true to
the code. It reads the functions :data:`~flakebot_magic.host.crashpoints.WATCHED`
names and follows every path through them (each branch of an ``if``; a
``return`` or ``raise`` ends a path; ``except`` and ``finally`` blocks are
the failure paths, not the steps): a call that writes, renames or removes
(:data:`CHANGES`) must be followed by a ``crash_point(...)`` before the next
such call and before the path ends. A new step added without a point fails
here.
"""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
from itertools import product
from pathlib import Path

import pytest

from flakebot_magic.host.crashpoints import ENV, POINTS, WATCHED

PACKAGE = Path(__file__).resolve().parents[2] / "flakebot_magic"

#: the calls that change what is on disk (by the name called: a method, a function, or ``git(...)`` itself)
CHANGES = frozenset(
    {
        "mkdir",
        "makedirs",
        "rename",
        "replace",
        "unlink",
        "rmtree",
        "rmdir",
        "swap_in",
        "atomic_write",
        "write_card",
        "write_text",
        "write_bytes",
        "symlink_to",
        "save",
        "commit",
        "fetch",
        "init",
        "copytree",
        "copy_beside",
        "fill",
        "add_tool",
        "remove_stale_locks",
        "_make_satisfiable",
        "_settle_lockfile",
        "git",
        "set_aside",
        "set_aside_non_file",
        "restore_modes",
        "replace_all",
        "push_paths",
        "push_derivation",
    }
)


def _called(node: ast.AST) -> str:
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute):
            return func.attr
        if isinstance(func, ast.Name):
            return func.id
    return ""


def _changes(node: ast.AST | None) -> bool:
    return node is not None and any(_called(n) in CHANGES for n in ast.walk(node))


def _point(stmt: ast.stmt) -> str:
    if isinstance(stmt, ast.Expr) and _called(stmt.value) == "crash_point":
        arg = stmt.value.args[0]  # type: ignore[attr-defined]
        assert isinstance(arg, ast.Constant), ast.dump(stmt)
        return str(arg.value)
    return ""


Path_ = list[str]  # "change@LINE", "point:NAME", "end"


def _paths(stmts: list[ast.stmt]) -> list[Path_]:
    """Every sequence of changes and points a run of ``stmts`` can take."""
    paths: list[Path_] = [[]]
    for stmt in stmts:
        if any(p and p[-1] == "end" for p in paths) and all(p and p[-1] == "end" for p in paths):
            break
        options: list[Path_]
        name = _point(stmt)
        if name:
            options = [[f"point:{name}"]]
        elif isinstance(stmt, ast.If):
            head = [f"change@{stmt.lineno}"] if _changes(stmt.test) else []
            options = [head + p for p in _paths(stmt.body)] + [head + p for p in _paths(stmt.orelse)]
        elif isinstance(stmt, (ast.For, ast.While)):
            head_node = stmt.iter if isinstance(stmt, ast.For) else stmt.test
            head = [f"change@{stmt.lineno}"] if _changes(head_node) else []
            options = [head + p for p in _paths(stmt.body)] + [head]
        elif isinstance(stmt, ast.With):
            head = [f"change@{stmt.lineno}"] if any(_changes(i.context_expr) for i in stmt.items) else []
            options = [head + p for p in _paths(stmt.body)]
        elif isinstance(stmt, ast.Try):
            options = [a + b for a, b in product(_paths(stmt.body), _paths(stmt.orelse))]
        elif isinstance(stmt, (ast.Return, ast.Raise)):
            options = [([f"change@{stmt.lineno}"] if _changes(stmt) else []) + ["end"]]
        else:
            options = [[f"change@{stmt.lineno}"]] if _changes(stmt) else [[]]
        paths = [p if p and p[-1] == "end" else p + o for p, o in product(paths, options)]
    return paths


def _functions() -> dict[str, ast.FunctionDef]:
    found = {}
    for module, names in WATCHED.items():
        tree = ast.parse((PACKAGE / module).read_text())
        defs = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        for name in names:
            assert name in defs, f"crashpoints.WATCHED names {module}:{name}, which does not exist"
            found[f"{module}:{name}"] = defs[name]
    return found


@pytest.mark.parametrize("where", sorted(_functions()))
def test_every_change_on_disk_is_followed_by_a_crash_point(where: str) -> None:
    function = _functions()[where]
    paths = _paths(function.body)
    assert any(any(step.startswith("change@") for step in path) for path in paths), f"{where} changes nothing"
    for path in paths:
        pending = ""
        for step in path:
            if step.startswith("change@"):
                assert not pending, f"{where}: the change at line {pending} has no crash point before the next one"
                pending = step.split("@")[1]
            elif step.startswith("point:"):
                pending = ""
            elif step == "end":
                break
        assert not pending, f"{where}: the change at line {pending} is not followed by a crash point"


def _points_in_code() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Expr) and (name := _point(node)):
                names.append(name)
    return names


def test_every_point_is_named_once_in_the_code_and_listed() -> None:
    used = _points_in_code()
    assert sorted(used) == sorted(set(used)), "a crash point name is used twice"
    assert set(used) == set(POINTS), {"not listed": set(used) - set(POINTS), "not in the code": set(POINTS) - set(used)}


def test_points_outside_watched_functions_are_only_in_the_watched_modules() -> None:
    """Points live where the transactions are: a stray one would not be killed at by the build tests (the start of a
    child's, in host/process.py, are killed at by tests/security/test_process_trees.py)."""
    modules = {*WATCHED, "host/process.py"}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "crashpoints.py":
            continue
        has = any(isinstance(n, ast.Expr) and _point(n) for n in ast.walk(ast.parse(path.read_text())))
        assert not has or str(path.relative_to(PACKAGE)) in modules, path


_HOOK = """
from flakebot_magic.host.crashpoints import crash_point
crash_point("fork.made")
print("passed fork.made", flush=True)
crash_point("txn.record")
print("passed txn.record the first time", flush=True)
crash_point("txn.record")
print("never printed", flush=True)
"""


def test_the_hook_kills_the_process_at_its_point_and_only_there() -> None:
    env = {**os.environ, ENV: "txn.record#2", "PYTHONPATH": str(PACKAGE.parent)}
    done = subprocess.run([sys.executable, "-c", _HOOK], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == -signal.SIGKILL
    assert done.stdout == "passed fork.made\npassed txn.record the first time\n"
    unset = {k: v for k, v in env.items() if k != ENV}
    done = subprocess.run([sys.executable, "-c", _HOOK], capture_output=True, text=True, env=unset, timeout=60)
    assert done.returncode == 0 and "never printed" in done.stdout


def test_an_unknown_point_is_a_bug_when_the_hook_is_set() -> None:
    env = {**os.environ, ENV: "fork.made", "PYTHONPATH": str(PACKAGE.parent)}
    code = "from flakebot_magic.host.crashpoints import crash_point\ncrash_point('no.such.point')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1 and "unknown crash point 'no.such.point'" in done.stderr
