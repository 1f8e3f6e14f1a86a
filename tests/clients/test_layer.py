"""clients/ is a leaf layer: it imports foundation modules and itself, nothing above (no stage, pipeline, front door)."""

from __future__ import annotations

import ast
from pathlib import Path

import flakebot_magic.clients

CLIENTS = Path(flakebot_magic.clients.__file__).parent
#: what clients/ may import from the package (the foundation layer)
FOUNDATION = {
    "_version",
    "errors",
    "fsutil",
    "process",
    "events",
    "options",
    "config",
    "locks",
    "git",
    "sandbox",
    "policy",
    "provenance",
    "runlog",
    "inventory",
    "model",
    "untrusted",
}


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """(the flakebot_magic module named, line, inside a function) for each import of the package in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.ImportFrom) and (child.level or (child.module or "").startswith("flakebot_magic")):
                if child.level == 0:
                    parts = (child.module or "").split(".")[1:]
                elif child.level == 1:
                    parts = ["clients", *((child.module or "").split(".") if child.module else [])]
                elif child.level == 2:
                    parts = (child.module or "").split(".") if child.module else [a.name for a in child.names]
                else:
                    parts = ["<above the package>"]
                found.append((".".join(parts), child.lineno, inner))
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.startswith("flakebot_magic"):
                        found.append((".".join(alias.name.split(".")[1:]), child.lineno, inner))
            visit(child, inner)

    visit(tree, False)
    return found


def test_clients_import_only_the_foundation_and_themselves() -> None:
    wrong = [
        f"{path.name}:{line} imports flakebot_magic.{module or '(the package root)'}"
        for path in sorted(CLIENTS.glob("*.py"))
        for module, line, _ in _imports(path)
        if module.split(".")[0] not in FOUNDATION | {"clients"}
    ]
    assert wrong == []


def test_no_import_of_the_package_is_hidden_in_a_function() -> None:
    hidden = [
        f"{path.name}:{line} imports flakebot_magic.{module} inside a function"
        for path in sorted(CLIENTS.glob("*.py"))
        for module, line, in_function in _imports(path)
        if in_function
    ]
    assert hidden == []


def test_every_module_is_under_600_lines() -> None:
    long = {path.name: n for path in CLIENTS.glob("*.py") if (n := len(path.read_text().splitlines())) > 600}
    assert long == {}
