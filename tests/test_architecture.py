"""docs/ARCHITECTURE.md is a map a newcomer can trust: every module has a row, every name it gives resolves.

* Every module of the package has a row in "Modules and the decisions they own": a row whose first cell names
  it (``stages/build.py``), or names its package (``registry/``) and whose text names the file
  (``vendored.py``). Every package has its place in the layer table (``tests/test_layers.py``).
* Every name the documents (docs/*.md, README.md) give in backquotes resolves: a path to a Python file
  (``sandbox/cargo.py``, ``tests/test_layers.py``), a path with a name in it (``host/entry.entry_damage``), or a
  dotted name that starts with one of the package's modules or classes (``events.outcome_of``,
  ``clients/contract.KINDS``, ``Settings.cache``). ``tests/test_names.py`` holds the names written in full
  (``flakebot_magic.…``) and the docstrings' references.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "flakebot_magic"
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
DOCUMENTS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
#: where a path the documents give may start: the repository, the package, the tests
PATH_ROOTS = (ROOT, PACKAGE, ROOT / "tests")
#: the folders whose Python files a bare file name (``test_sinks.py``) may name
FILE_FOLDERS = ("flakebot_magic", "tests", "scripts", "benchmarks")
#: the endings of files that are not Python modules: ``flake.nix``, ``nix.conf``, ``manifest.json`` ...
NOT_MODULES = {
    "conf", "json", "toml", "nix", "lock", "log", "md", "sh", "ipynb", "html", "css", "js", "sqlite3", "txt",
    "yaml", "yml", "jsonl", "tsv", "csv", "cfg", "ini", "rs", "wasm", "so", "whl", "gz", "zip", "tar",
}  # fmt: skip


def package_modules() -> list[str]:
    """Every module's path in the package (``stages/build.py``), the packages' ``__init__.py`` and the eval
    suites' task files (data) apart."""
    return sorted(
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if p.name != "__init__.py" and "suites" not in p.relative_to(PACKAGE).parts
    )


def decision_rows(text: str) -> list[tuple[str, str]]:
    """(first cell, whole row) of each row of the table "Modules and the decisions they own"."""
    section = text.split("\n## Modules and the decisions they own\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith("| module |"):
            rows.append((line.split("|")[1], line))
    return rows


def unmapped(text: str) -> list[str]:
    """The package's modules that no row of ``text``'s table names."""
    rows = decision_rows(text)
    missing = []
    for module in package_modules():
        folder, _, name = module.rpartition("/")
        named = any(f"`{module}`" in first for first, _ in rows)
        in_package_row = bool(folder) and any(
            f"`{folder}/`" in first and (f"`{name}`" in row or f"{name}:" in row or f"`{name}`:" in row)
            for first, row in rows
        )
        if not (named or in_package_row):
            missing.append(module)
    return missing


def test_every_module_has_a_row() -> None:
    missing = unmapped(ARCHITECTURE.read_text(encoding="utf-8"))
    assert missing == [], (
        f"give these modules a row in docs/ARCHITECTURE.md's table of modules and the decisions they own "
        f"(or name them in their package's row): {missing}"
    )


def test_a_module_without_a_row_is_seen() -> None:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| `stages/build.py` |"))
    assert "stages/build.py" in unmapped(text.replace(row + "\n", ""))


# -- the names the documents give ---------------------------------------------------------------------------

#: a name in backquotes: a path (``stages/build.py``, ``host/entry.entry_damage``) or a dotted name (``events.outcome_of``)
NAME = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*(?:[/.][A-Za-z_][A-Za-z0-9_]*)+/?)`")


@cache
def module_names() -> dict[str, list[str]]:
    """A module's last name (``tools``) -> the modules of that name (``flakebot_magic.manage.tools``)."""
    found: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if "suites" in path.relative_to(PACKAGE).parts or "testing" in path.relative_to(PACKAGE).parts[:1]:
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        dotted = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found.setdefault(dotted.rpartition(".")[2], []).append(dotted)
    return found


@cache
def class_homes() -> dict[str, list[str]]:
    """A class's name -> the modules that define a class of that name (read from the source, not imported)."""
    found: dict[str, list[str]] = {}
    for modules in module_names().values():
        for module in modules:
            path = ROOT / (module.replace(".", "/") + ".py")
            if not path.is_file():
                path = ROOT / module.replace(".", "/") / "__init__.py"
            for node in ast.parse(path.read_text(encoding="utf-8")).body:
                if isinstance(node, ast.ClassDef):
                    found.setdefault(node.name, []).append(module)
    return found


def _attribute(obj: object, names: list[str]) -> bool:
    for name in names:
        fields = getattr(obj, "__dataclass_fields__", {})
        if name in fields or name in getattr(obj, "__annotations__", {}):
            return True  # a field: it exists, and nothing is named below it
        if not hasattr(obj, name):
            # an instance's attribute, set in a method (``FlakeError.file``)
            return isinstance(obj, type) and f"self.{name} =" in inspect.getsource(obj)
        obj = getattr(obj, name)
    return True


def _in_module(module: str, names: list[str]) -> bool:
    try:
        obj = importlib.import_module(module)
    except ImportError:
        return False
    return _attribute(obj, names)


#: dotted names in the documents that are not Python: TOML tables and keys, a registry's name
NOT_PYTHON = {
    "workspace.metadata": "a Cargo.toml table",
    "files.example": "a task file's key (docs/eval.md)",
    "files.test": "a task file's key (docs/eval.md)",
    "crates.io": "the registry",
}
#: user's files the documents name
USERS_FILES = {"ipython_config.py"}


@cache
def crash_points() -> set[str]:
    """The crash points' names (``deploy.done``): written in the package as ``crash_point("deploy.done")``."""
    point = re.compile(r"crash_point\(\s*f?\"([a-z_.{}]+)\"")
    return {m for p in PACKAGE.rglob("*.py") for m in point.findall(p.read_text(encoding="utf-8"))}


def resolves(name: str) -> bool | None:
    """Whether a name the documents give resolves; None when it is not the package's to resolve (``os.walk``)."""
    if name in NOT_PYTHON or name in USERS_FILES or name in crash_points():
        return None
    head, _, tail = name.rpartition("/")
    if name.endswith(".py"):
        if not head:  # a bare file name, as a package's row gives it
            return any(next((ROOT / folder).rglob(name), None) is not None for folder in FILE_FOLDERS)
        return any((root / name).is_file() for root in PATH_ROOTS)
    if "." not in tail or name.rpartition(".")[2] in NOT_MODULES:
        return None  # a folder, a cache directory (``keys/KEY/``), an MCP method (``server/discover``), a file
    if head:  # a path with names in it: ``host/entry.entry_damage``
        module, *names = tail.split(".")
        return any(
            (root / head / f"{module}.py").is_file() and _in_module(_dotted(root, head, module), names)
            for root in PATH_ROOTS
        )
    first, *names = name.split(".")
    if (PACKAGE / f"{first}.py").is_file() or (PACKAGE / first / "__init__.py").is_file():
        return _dotted_resolves(f"flakebot_magic.{first}", names)
    if first in module_names():
        return any(_dotted_resolves(m, names) for m in module_names()[first])
    if first in class_homes():
        return any(_in_module(m, [first, *names]) for m in class_homes()[first])
    return None


def _dotted(root: Path, head: str, module: str) -> str:
    prefix = [] if root == ROOT else ["flakebot_magic"]
    return ".".join([*prefix, *head.split("/"), module])


def _dotted_resolves(module: str, names: list[str]) -> bool:
    """``module`` and then ``names``: submodules as long as they are modules, then attributes."""
    while names and hasattr(importlib.import_module(module), "__path__"):
        if importlib.util.find_spec(f"{module}.{names[0]}") is None:
            break
        module, names = f"{module}.{names[0]}", names[1:]
    return _in_module(module, names)


def document_names() -> list[tuple[str, str]]:
    found = []
    for document in DOCUMENTS:
        for name in sorted(set(NAME.findall(document.read_text(encoding="utf-8")))):
            found.append((str(document.relative_to(ROOT)), name))
    return found


@pytest.mark.parametrize(("document", "name"), document_names())
def test_every_name_a_document_gives_resolves(document: str, name: str) -> None:
    assert resolves(name) is not False, f"{document} names `{name}`, which is not in the repository or the package"


def test_the_resolver_can_fail() -> None:
    """What is gone is refused, in each form; what is not the package's is left alone."""
    assert resolves("stages/build.py") and resolves("tests/test_layers.py") and resolves("cargo.py")
    assert resolves("host/entry.entry_damage") and resolves("events.outcome_of") and resolves("Settings.cache")
    assert resolves("clients/contract.KINDS") and resolves("tools.tool_json") and resolves("FlakeError.file")
    assert resolves("stages/nix.nix_sandbox") is False  # the name ARCHITECTURE.md gave for a year
    assert resolves("stages/nix.py") is False and resolves("nosuch.py") is False
    assert resolves("events.no_such_thing") is False and resolves("Settings.no_such_field") is False
    assert resolves("os.walk") is None and resolves("flake.nix") is None and resolves("keys/KEY/") is None


def test_every_kind_has_its_contract_documented() -> None:
    """docs/tool-contract.md has a section per row of the kinds table (``## `cli`: ...``), and none for a kind that
    is not a row: the document is checked against the table, which is the list."""
    from flakebot_magic.clients.kinds import KINDS

    text = (ROOT / "docs" / "tool-contract.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^## `([a-z0-9-]+)`:", text, re.M))
    # the package's own rows: a test-only row (a test's module, docs/ARCHITECTURE.md) ships no contract
    shipped = {kind for kind, client in KINDS.items() if client.__module__.startswith("flakebot_magic.")}
    assert documented == shipped, (
        f"docs/tool-contract.md: a '## `KIND`: ...' section for each of {sorted(shipped)}; it has {sorted(documented)}"
    )


def test_the_backend_choices_are_the_backends_table() -> None:
    """The ``backend`` option lists its choices by hand (options.py sits below backends/): ``auto`` and the rows
    of :data:`flakebot_magic.backends.BACKENDS`, no more, no fewer."""
    from flakebot_magic.backends import BACKENDS
    from flakebot_magic.options import option

    assert set(option("backend").choices) == {"auto", *BACKENDS}
