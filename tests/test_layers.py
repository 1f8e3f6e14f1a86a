"""The package's layers hold: a module imports only its own layer or lower ones, no cycles, no module over 600 lines.

The layers, bottom to top (docs/ARCHITECTURE.md draws them):

1. foundation: errors, files, processes, events, options and settings, locks, git, the sandbox, the policy, records,
   and what a registry is (``registry/base.py``)
2. leaves: ``registry/`` and ``clients/`` (a deployed tool's client knows nothing of how it was built)
3. stages: ``stages/``, ``edit/``, ``backends/``
4. the spine: the pipeline, what manages tools, and the eval that runs many builds
5. front doors and views: ``__init__``, the magic, the command, the server, the widget, printed progress

Imports inside ``if TYPE_CHECKING:`` count too: a type that lives above is a dependency on what is above.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "flakebot_magic"
MAX_LINES = 600

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
    "edit_summary",
    "runlog",
    "inventory",
    "model",
    "model_http",
    "request",
    "diagnostics",
    "cargo",
    "environment",
    "usage",
    "steering",
    "storage",
    "crashpoints",
    "untrusted",
    "commands",
    # what a registry is (a protocol and its data types): cargo and the sandbox need it, as data
    "registry.base",
}
LAYERS = {
    1: FOUNDATION,
    2: {"registry", "clients"},
    3: {"stages", "edit", "backends"},
    4: {
        "pipeline",
        "editing",
        "background",
        "tools",
        "cleanup",
        "export",
        "eval",
        "workspace_cargo",
        "transaction",
        "doctor",
        "deployed",
    },
    5: {"__init__", "magics", "cli", "server", "ui", "ui_rows", "record", "progress", "agent"},
}
#: test doubles and their fixtures sit beside the package, used only by tests and the docs' examples
OUTSIDE = {"testing"}
#: the one module allowed to start a test double: `flakebot eval --replay` serves solution scripts
#: from the fake OpenAI server, and labels the results "replay" everywhere (never a model's)
DOUBLES_ALLOWED = {"eval.replay": {"testing.fake_openai"}}


def _layer(module: str) -> int | None:
    if module in FOUNDATION:
        return 1
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


def _imports(name: str, path: Path) -> set[str]:
    """The flakebot_magic modules ``name`` imports, relative to the package (``stages.build``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name.split(".") if path.name == "__init__.py" and name != "__init__" else name.split(".")[:-1]
    if name == "__init__":
        package = []
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                module = ".".join([*base, *([node.module] if node.module else [])])
                if node.module is None:  # from . import x, y: each name may be a module
                    targets.update(".".join([*base, alias.name]) for alias in node.names)
                    continue
            elif node.module and node.module.startswith("flakebot_magic"):
                module = node.module.removeprefix("flakebot_magic").lstrip(".")
            else:
                continue
            targets.add(module or "__init__")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("flakebot_magic"):
                    targets.add(alias.name.removeprefix("flakebot_magic").lstrip(".") or "__init__")
    return targets


MODULES = _modules()


def test_every_module_has_a_layer() -> None:
    unplaced = [m for m in MODULES if _layer(m) is None and m.split(".")[0] not in OUTSIDE]
    assert unplaced == [], f"place these modules in a layer (tests/test_layers.py): {unplaced}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.split(".")[0] not in OUTSIDE))
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
        if (m.startswith("clients") and t.startswith("registry"))
        or (m.startswith("registry") and t.startswith("clients"))
    ]
    assert crossing == []


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
