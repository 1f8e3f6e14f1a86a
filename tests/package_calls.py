"""Every call in the package's source, for the audits that read the package's AST (tests/security/)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

__all__ = ["PACKAGE", "package_calls"]

PACKAGE = Path(__file__).resolve().parents[1] / "flakebot_magic"


def package_calls(skip: tuple[str, ...] = ("testing/", "eval/suites/")) -> Iterator[tuple[str, ast.Call]]:
    """(module, call) for every call in the package, but in the test doubles and the suites' hidden tests."""
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        if module.startswith(skip):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                yield module, node
