"""The package's layers hold: a module imports only its own layer or lower ones, no cycles, no module over 600 lines.

The layers are packages (docs/ARCHITECTURE.md draws them), bottom to top:

1. foundation: the few modules every layer names (errors, events, options and settings, the request, untrusted
   text) and the packages of mechanisms: ``host/`` (processes, files, locks, git, the cache layout),
   ``sandbox/`` (untrusted code: cargo, the tree policy), ``llm/`` (the one channel to a model), ``records/``
   (what is kept about tools and runs), and what a crate registry is (``registry/base.py``)
2. leaves: ``registry/`` and ``clients/`` (a deployed tool's client knows nothing of how it was built); neither
   imports the other, and ``clients/`` imports the package at module level only
3. stages: ``stages/``, ``edit/``, ``backends/``
4. the spine: ``pipeline/``, ``manage/`` (the built tools by name) and ``eval/`` (many builds)
5. front doors and views: ``__init__``, ``cli``, ``magics``, ``server/``, ``agent/``, ``views/``

Imports inside ``if TYPE_CHECKING:`` count too: a type that lives above is a dependency on what is above.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "flakebot_magic"
MAX_LINES = 600

#: each layer's packages (and the few top-level modules), by top-level name; a dotted name places one module apart
LAYERS: dict[int, set[str]] = {
    1: {
        "_version",
        "errors",
        "untrusted",
        "events",
        "options",
        "config",
        "request",
        "commands",
        "host",
        "sandbox",
        "llm",
        "records",
        # what a registry is (a protocol and its data types): cargo and the sandbox need it, as data
        "registry.base",
    },
    2: {"registry", "clients"},
    3: {"stages", "edit", "backends"},
    4: {"pipeline", "manage", "eval"},
    5: {"__init__", "cli", "magics", "magic_cells", "server", "agent", "views"},
}
#: test doubles and their fixtures sit beside the package, used only by tests and the docs' examples
OUTSIDE = {"testing"}
#: the one module allowed to start a test double: `flakebot eval --replay` serves solution scripts
#: from the fake OpenAI server, and labels the results "replay" everywhere (never a model's)
DOUBLES_ALLOWED = {"eval.replay": {"testing.fake_openai"}}
#: layer 2's packages do not import each other
LEAVES = ("registry", "clients")


def _layer(module: str) -> int | None:
    for number, names in LAYERS.items():
        if module in names:
            return number
    top = module.split(".")[0]
    for number, names in LAYERS.items():
        if top in names:
            return number
    return None


SUITES = PACKAGE / "eval" / "suites"


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if SUITES in path.parents:  # the built-in eval suites' task files: data, not modules of the package
            continue
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts) or "__init__"
        found[name] = path
    return found


def _imports(name: str, path: Path, *, in_functions: bool = True) -> set[str]:
    """The flakebot_magic modules ``name`` imports, relative to the package (``stages.build``).

    ``in_functions=False``: only the imports made when the module loads (not those inside a function).
    """
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name.split(".") if path.name == "__init__.py" and name != "__init__" else name.split(".")[:-1]
    if name == "__init__":
        package = []
    targets: set[str] = set()

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if not inner or in_functions:
                _collect(child)
            visit(child, inner)

    def _collect(node: ast.AST) -> None:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                module = ".".join([*base, *([node.module] if node.module else [])])
                if node.module is None:  # from . import x, y: each name may be a module
                    targets.update(".".join([*base, alias.name]) for alias in node.names)
                    return
            elif node.module and node.module.startswith("flakebot_magic"):
                module = node.module.removeprefix("flakebot_magic").lstrip(".")
            else:
                return
            targets.add(module or "__init__")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("flakebot_magic"):
                    targets.add(alias.name.removeprefix("flakebot_magic").lstrip(".") or "__init__")

    visit(tree, False)
    return targets


MODULES = _modules()
PLACED = sorted(m for m in MODULES if m.split(".")[0] not in OUTSIDE)


def test_every_module_has_a_layer() -> None:
    unplaced = [m for m in PLACED if _layer(m) is None]
    assert unplaced == [], f"place these modules' packages in a layer (tests/test_layers.py): {unplaced}"


def test_the_layers_name_packages_and_few_modules() -> None:
    """A layer lists packages; the top-level modules left are the few every layer names, and the front doors."""
    named = {n for names in LAYERS.values() for n in names if "." not in n}
    flat = {n for n in named if (PACKAGE / f"{n}.py").is_file()}
    packages = {n for n in named if (PACKAGE / n / "__init__.py").is_file()}
    assert named == flat | packages | {"__init__"}, f"not in the package: {named - flat - packages - {'__init__'}}"
    assert len(flat) <= 12, f"top-level modules: {sorted(flat)}; move them into the package of their layer"


@pytest.mark.parametrize("module", PLACED)
def test_imports_point_down(module: str) -> None:
    own = _layer(module)
    assert own is not None
    upward = []
    for target in _imports(module, MODULES[module]):
        if target.split(".")[0] in OUTSIDE:
            if target not in DOUBLES_ALLOWED.get(module, set()):
                upward.append(f"{target} (test doubles)")
            continue
        layer = _layer(target)
        if layer is not None and layer > own:
            upward.append(f"{target} (layer {layer})")
    assert upward == [], f"{module} (layer {own}) imports from above: {upward}"


def test_leaves_do_not_import_each_other() -> None:
    crossing = [
        (m, t)
        for m in MODULES
        for t in _imports(m, MODULES[m])
        for leaf in LEAVES
        if m.split(".")[0] == leaf and t.split(".")[0] in set(LEAVES) - {leaf}
    ]
    assert crossing == []


def test_clients_import_the_package_at_module_level_only() -> None:
    """A client's dependencies show at its top: none is hidden in a function (so the layer test sees them all)."""
    hidden = [
        f"{m} imports flakebot_magic.{t} inside a function"
        for m in MODULES
        if m.split(".")[0] == "clients"
        for t in _imports(m, MODULES[m]) - _imports(m, MODULES[m], in_functions=False)
    ]
    assert hidden == []


def test_no_import_cycles() -> None:
    graph = {m: {t for t in _imports(m, MODULES[m]) if t in MODULES and t != m} for m in MODULES}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*trail[trail.index(nxt) :], nxt] if nxt in trail else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    # a package's __init__ re-exporting its own submodules is not a cycle between layers
    real = [c for c in cycles if len({x.split(".")[0] for x in c}) > 1 or not any(x == c[0].split(".")[0] for x in c)]
    assert real == [], f"import cycles: {real}"


def test_no_module_over_the_limit() -> None:
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}, f"split these modules (over {MAX_LINES} lines): {long}"
