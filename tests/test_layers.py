"""The package's layers are true: docs/ARCHITECTURE.md's layer table is the import graph's order.

The table ("## Layers") lists every package (and the few top-level modules) in rows, bottom-up, and within a
row from left to right: a module imports only its own package's modules and the packages listed before its
package. These tests read the table, not a copy of it, so the document and the code cannot drift apart:

* every module of the package belongs to a package the table lists, and everything listed exists;
* every import points to a package listed before the importer's own (so no two packages import each other,
  in either direction, and each row is as true as the table);
* the graph of packages has no cycle (said on its own, with the cycle named, whatever the table says);
* no module is over 600 lines.

The graph is grimp's (a maintained library; it reads every import, those inside functions and under
``if TYPE_CHECKING:`` too: a type that lives above is a dependency on what is above, and resolves
``from .. import __version__`` to the module it loads). One question grimp does not answer, whether an import
is made inside a function, is read with the stdlib's ``ast`` (``clients/`` imports the package at module
level only).
"""

from __future__ import annotations

import ast
import graphlib
import re
from collections import defaultdict
from functools import cache
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "flakebot_magic"
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
MAX_LINES = 600
#: test doubles and their fixtures sit beside the package, used only by tests and the docs' examples
OUTSIDE = {"testing"}
#: the one module allowed to start a test double: `flakebot eval --replay` serves solution scripts
#: from the fake OpenAI server, and labels the results "replay" everywhere (never a model's)
DOUBLES_ALLOWED = {"eval.replay": {"testing.fake_openai"}}
#: layer 2's packages do not import each other
LEAVES = ("registry", "clients")
#: a row of the layer table: ``| 1. foundation | `_version.py`, `host/`, ... | what it owns |``
ROW = re.compile(r"^\| *(\d+)\. [^|]+\| *([^|]+)\|", re.M)


def layer_table(text: str) -> list[list[str]]:
    """The packages of each row of ARCHITECTURE.md's layer table, bottom-up (``host/`` -> ``host``,
    ``errors.py`` -> ``errors``, ``__init__.py`` -> ``__init__``: the package's own front)."""
    return [[name.rstrip("/").removesuffix(".py") for name in re.findall(r"`([^`]+)`", cell)] for _, cell in rows(text)]


def rows(text: str) -> list[tuple[str, str]]:
    """(number, packages' cell) of each row of the layer table, as written."""
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    return ROW.findall(section)


ROWS = layer_table(ARCHITECTURE.read_text(encoding="utf-8"))
#: each package's place, bottom-up: it may import those of a lower place
ORDER = {name: index for index, name in enumerate(n for row in ROWS for n in row)}
ROW_OF = {name: number for number, row in enumerate(ROWS, 1) for name in row}


@cache
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("flakebot_magic", cache_dir=None)


def short(module: str) -> str:
    """``flakebot_magic.stages.build`` -> ``stages.build``; the package itself -> ``__init__``."""
    return module.removeprefix("flakebot_magic").lstrip(".") or "__init__"


def package_of(module: str) -> str:
    return short(module).split(".")[0]


def modules() -> list[str]:
    """Every module of the package (short names), the test doubles' apart."""
    return sorted(short(m) for m in graph().modules if package_of(m) not in OUTSIDE)


def imports(module: str) -> set[str]:
    """The package's modules that ``module`` (a short name) imports, wherever in it (short names)."""
    full = "flakebot_magic" if module == "__init__" else f"flakebot_magic.{module}"
    return {short(m) for m in graph().find_modules_directly_imported_by(full)}


def package_graph() -> dict[str, set[str]]:
    """Package -> the other packages its modules import (the test doubles' apart)."""
    edges: dict[str, set[str]] = defaultdict(set)
    for module in modules():
        edges[package_of(module)] |= {package_of(t) for t in imports(module) if package_of(t) not in OUTSIDE}
    return {p: targets - {p} for p, targets in edges.items()}


def upward(module: str) -> list[str]:
    """The imports of ``module`` that break the table's order, each with why."""
    own = package_of(module)
    wrong = []
    for target in sorted(imports(module)):
        theirs = package_of(target)
        if theirs in OUTSIDE:
            if target not in DOUBLES_ALLOWED.get(module, set()):
                wrong.append(f"{target} (a test double)")
        elif theirs not in ORDER:
            wrong.append(f"{target} (its package {theirs} has no place in the layer table)")
        elif theirs != own and ORDER[theirs] > ORDER[own]:
            where = "later in the same row" if ROW_OF[theirs] == ROW_OF[own] else f"row {ROW_OF[theirs]}"
            wrong.append(f"{target} ({where})")
    return wrong


def test_the_table_is_read() -> None:
    """The five rows, bottom-up, each naming packages: the checks below would pass on an empty table."""
    numbers = [int(number) for number, _ in rows(ARCHITECTURE.read_text(encoding="utf-8"))]
    assert numbers == [1, 2, 3, 4, 5], f"the layer table's rows are numbered 1 to 5, bottom-up: {numbers}"
    assert len(ROWS) == 5 and all(ROWS), ROWS
    assert ROWS[0][0] == "_version" and "cli" in ROWS[-1], ROWS


def test_every_module_has_a_layer() -> None:
    unplaced = sorted({package_of(m) for m in modules()} - set(ORDER))
    assert unplaced == [], f"add these packages to the layer table in docs/ARCHITECTURE.md: {unplaced}"


def test_the_table_names_what_exists() -> None:
    """Each name is a package (a directory with ``__init__.py``) or a top-level module, once; few are modules."""
    names = [n for row in ROWS for n in row]
    assert len(names) == len(set(names)), f"named twice: {sorted(n for n in names if names.count(n) > 1)}"
    flat = {n for n in names if (PACKAGE / f"{n}.py").is_file()}
    packages = {n for n in names if (PACKAGE / n / "__init__.py").is_file()}
    assert set(names) == flat | packages, f"not in the package: {set(names) - flat - packages}"
    assert len(flat) <= 12, f"top-level modules: {sorted(flat)}; move them into the package of their layer"


@pytest.mark.parametrize("module", modules())
def test_imports_point_down(module: str) -> None:
    wrong = upward(module)
    assert wrong == [], (
        f"{module} ({package_of(module)}, row {ROW_OF.get(package_of(module))}) imports from above it in the layer "
        f"table of docs/ARCHITECTURE.md: {wrong}; move what it needs down, or the importer up"
    )


def test_no_package_cycles() -> None:
    """No two packages import each other, directly or through others (named, whatever the table says)."""
    try:
        order = list(graphlib.TopologicalSorter(package_graph()).static_order())
    except graphlib.CycleError as exc:
        pytest.fail(f"the packages import each other in a cycle: {' -> '.join(exc.args[1])}")
    assert set(order) >= set(ORDER) - {"__init__"} - {n for n in ORDER if (PACKAGE / f"{n}.py").is_file()}


def test_the_checks_can_fail() -> None:
    """An import up the table and a cycle are seen: ``upward`` and the sorter are not blind."""
    assert ORDER["host"] < ORDER["stages"]
    assert upward("host.names") == []
    # a fake graph with a cycle between two packages
    with pytest.raises(graphlib.CycleError):
        list(graphlib.TopologicalSorter({"a": {"b"}, "b": {"a"}}).static_order())
    original = graph().find_modules_directly_imported_by("flakebot_magic.host.names")
    graph().add_import(importer="flakebot_magic.host.names", imported="flakebot_magic.stages.build")
    try:
        assert upward("host.names") == ["stages.build (row 3)"]
        assert "stages" in package_graph()["host"]
    finally:
        graph().remove_import(importer="flakebot_magic.host.names", imported="flakebot_magic.stages.build")
    assert graph().find_modules_directly_imported_by("flakebot_magic.host.names") == original


def test_leaves_do_not_import_each_other() -> None:
    edges = package_graph()
    assert [(leaf, other) for leaf in LEAVES for other in LEAVES if other in edges.get(leaf, set())] == []


def _top_level_imports(path: Path) -> tuple[set[int], set[int]]:
    """The line numbers of the module's imports: (made when it loads, made inside a function)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    inner = {
        node.lineno
        for function in ast.walk(tree)
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
        for node in ast.walk(function)
        if isinstance(node, (ast.Import, ast.ImportFrom))
    }
    every = {node.lineno for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))}
    return every - inner, inner


def test_clients_import_the_package_at_module_level_only() -> None:
    """A client's dependencies show at its top: none is hidden in a function."""
    hidden = []
    for module in modules():
        if package_of(module) != "clients":
            continue
        path = PACKAGE.joinpath(*module.split(".")).with_suffix(".py")
        if not path.is_file():
            path = PACKAGE.joinpath(*module.split("."), "__init__.py")
        _, inner = _top_level_imports(path)
        for target in imports(module):
            details = graph().get_import_details(
                importer=f"flakebot_magic.{module}", imported=f"flakebot_magic.{target}"
            )
            hidden += [f"{module} imports {target} inside a function" for d in details if d["line_number"] in inner]
    assert hidden == []


def test_no_module_over_the_limit() -> None:
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in PACKAGE.rglob("*.py")
        if "suites" not in p.relative_to(PACKAGE).parts
        and (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}, f"split these modules (over {MAX_LINES} lines): {long}"
