"""Every name the prose gives resolves: a module or attribute named in a docstring, a comment or the docs exists.

A rename or a move leaves comments behind that name what is gone ("``editing.py``",
":mod:`.model_io`"). These tests read the prose, not the code, and resolve each name
it gives against the package as it is:

* ``flakebot_magic.x.y`` anywhere in the package's sources, the tests, README.md and
  docs/*.md: a module, or an attribute of the longest module prefix;
* a Sphinx role in a docstring (``:mod:``, ``:func:``, ``:class:``, ``:meth:``, ``:attr:``,
  ``:data:``, ``:exc:``) with a relative target (``.x``, ``~.x.y``): resolved from the
  module's own package;
* a ``*.py`` file named in backquotes anywhere in that prose (and CONTRIBUTING.md): it exists.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "flakebot_magic"
#: the prose read for dotted names (eval suites' fixture crates and solution scripts are data)
PROSE = sorted(
    [
        *(p for p in PACKAGE.rglob("*.py") if "suites" not in p.parts),
        *(p for p in (ROOT / "tests").rglob("*.py") if p.name != "test_names.py"),
        ROOT / "README.md",
        *(ROOT / "docs").glob("*.md"),
    ]
)
#: ``flakebot_magic.json`` (the server extension's config file) is a file, not a module
DOTTED = re.compile(r"\bflakebot_magic(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
ROLE = re.compile(r":(?:mod|func|class|meth|attr|data|exc):`~?(\.[A-Za-z_.][A-Za-z0-9_.]*)`")
PY_FILE = re.compile(r"`((?:[a-z_]+/)*[a-z_0-9]+\.py)`")
#: names the prose still gives in files other engineers are changing at the same time (issue 22's parallel
#: branches); each must still be broken (else it is taken off), and is fixed when those branches land
PENDING: set[tuple[str, str]] = set()


def resolve(dotted: str) -> bool:
    """Whether ``dotted`` names a module, or an attribute (at any depth) of the longest module prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if attr in getattr(obj, "__dataclass_fields__", {}) or attr in getattr(obj, "__annotations__", {}):
                obj = None  # a field: it exists, and nothing is named below it
                continue
            if not hasattr(obj, attr):
                return _set_on_self(obj, attr)
            obj = getattr(obj, attr)
        return True
    return False


def _set_on_self(owner: object, attr: str) -> bool:
    """Whether a class sets ``self.attr`` in its source: an instance attribute, named but not on the class."""
    if not isinstance(owner, type):
        return False
    module = importlib.import_module(owner.__module__)
    source = Path(module.__file__ or "").read_text()
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == owner.__name__:
            return any(
                isinstance(n, ast.Attribute)
                and n.attr == attr
                and isinstance(n.value, ast.Name)
                and n.value.id == "self"
                for n in ast.walk(node)
            )
    return False


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_of(path: Path) -> str:
    name = _module_name(path)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def dotted_names() -> list[tuple[str, str]]:
    """(where, name) of every ``flakebot_magic.…`` name in the prose, once per file."""
    found = []
    for path in PROSE:
        for name in sorted(set(DOTTED.findall(path.read_text())) - {"flakebot_magic.json"}):
            found.append((str(path.relative_to(ROOT)), name.rstrip(".")))
    return found


def relative_roles() -> list[tuple[str, str]]:
    """(where, absolute name) of every relative Sphinx target in the package's sources."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        package = _package_of(path)
        for target in sorted(set(ROLE.findall(path.read_text()))):
            found.append((str(path.relative_to(ROOT)), importlib.util.resolve_name(target, package)))
    return found


@pytest.mark.parametrize(("where", "name"), dotted_names())
def test_every_dotted_name_in_the_prose_resolves(where: str, name: str) -> None:
    if (where, name) in PENDING:
        assert not resolve(name), f"{where}: {name} resolves now; take it off PENDING"
        return
    assert resolve(name), f"{where} names {name}, which is neither a module nor an attribute of one"


@pytest.mark.parametrize(("where", "name"), relative_roles())
def test_every_relative_reference_in_a_docstring_resolves(where: str, name: str) -> None:
    assert resolve(name), f"{where} refers to {name}, which is neither a module nor an attribute of one"


#: Python files the prose names that are the user's, not the repository's
USERS_FILES = {"ipython_config.py"}


@pytest.mark.parametrize("doc", [str(p.relative_to(ROOT)) for p in [*PROSE, ROOT / "CONTRIBUTING.md"]])
def test_every_python_file_the_prose_names_exists(doc: str) -> None:
    """From the repository's root, from tests/, or the tail of a file of the package (``cargo.py`` in a row on
    ``sandbox/``), of the tests, the scripts or the benchmarks."""
    tails = {
        p.relative_to(ROOT).as_posix()
        for d in ("flakebot_magic", "tests", "scripts", "benchmarks")
        for p in (ROOT / d).rglob("*.py")
    }
    named = set(PY_FILE.findall((ROOT / doc).read_text())) - USERS_FILES
    missing = sorted(n for n in named if not ((ROOT / n).is_file() or any(t.endswith("/" + n) for t in tails)))
    assert not missing, f"{doc} names Python files that do not exist: {missing}"


def test_the_resolver_can_fail() -> None:
    """The checks above would pass on anything if :func:`resolve` did: names that are gone are refused."""
    assert resolve("flakebot_magic.records.inventory.Inventory.check")
    assert resolve("flakebot_magic.records.inventory.ToolRecord.name")  # a dataclass field
    assert not resolve("flakebot_magic.editing")
    assert not resolve("flakebot_magic.edit.model_io")
    assert not resolve("flakebot_magic.records.inventory.Inventory.no_such_method")


def _importers(top: str) -> set[str]:
    """``file:function`` (``<module>`` at the top) of every import of ``top`` or a submodule in the package."""
    importers = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        scopes: dict[ast.AST, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                for inner in ast.walk(node):
                    scopes.setdefault(inner, node.name)
        for node in ast.walk(tree):
            modules = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            if any(m == top or m.startswith(top + ".") for m in modules):
                importers.add(f"{path.relative_to(PACKAGE).as_posix()}:{scopes.get(node, '<module>')}")
    return importers


def test_only_the_magic_imports_ipython() -> None:
    """What magics.py's docstring and ARCHITECTURE.md say: IPython is imported by magics.py and by
    ``commands.py``'s decorators and ``magic_cells.py`` (which the magic calls), nowhere else in the package."""
    importers = _importers("IPython")
    assert {i for i in importers if not i.startswith("magics.py:")} == {
        "config.py:magic_argument_decorators",
        "commands.py:magic_argument",
        "magic_cells.py:spare_examples",
        "magic_cells.py:_inside_running_code",
        "magic_cells.py:_async_ok",
    }
    assert "magics.py:<module>" in importers


def test_only_the_widget_uses_ipywidgets() -> None:
    """What views/widget.py's docstring says: it imports ipywidgets; the magic only to see that it is installed."""
    assert _importers("ipywidgets") == {"views/widget.py:<module>", "magics.py:_progress_mode"}


#: what "registry" must not name: it is a crate registry (``flakebot_magic.registry``), never the tool inventory
#: (``records/inventory.py``) nor the table of started tools (``clients/lifecycle.py``)
NOT_A_REGISTRY = re.compile(
    r"tools? registry|registry record\b|per-tool registry|registry watcher|Registry(?:Damaged|Watcher)",
    re.IGNORECASE,
)
#: the one place the old name stays: errors.py's alias, for code that catches the error by it
OLD_NAME_KEPT = "RegistryDamaged = InventoryDamaged"
#: files other engineers are changing at the same time (issue 22's parallel branches): renamed when those land
REGISTRY_PENDING: set[str] = set()


def test_registry_means_a_crate_registry() -> None:
    texts = [*PROSE, ROOT / "CHANGELOG.md"]
    named = {
        str(p.relative_to(ROOT))
        for p in texts
        if p.name not in ("test_names.py", "CHANGELOG.md")
        and NOT_A_REGISTRY.search(p.read_text().replace(OLD_NAME_KEPT, ""))
    }
    assert named == REGISTRY_PENDING, (
        f"'registry' names the tool inventory in {sorted(named - REGISTRY_PENDING)}; "
        f"say 'tool inventory' (pending files that no longer do: {sorted(REGISTRY_PENDING - named)})"
    )
