"""The sink audit: every call in the package that could run text as code, or read a tree or a stream without a
bound, is listed here by reading the package's AST, and each must be a cell of the matrix in docs/SECURITY.md.

Before issue 33, ``stages/accept.py`` ran ``>>>`` examples with ``eval``/``exec`` in flakebot's own process, and
text from a model's plan, an agent's request, a shared notebook and a tool's stderr reached it. The audit fails
on any such call that is new, and on an allowance that no longer matches a call (a stale reason is no reason).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "flakebot_magic"
SECURITY = Path(__file__).resolve().parents[2] / "docs" / "SECURITY.md"

#: builtins that turn text into code (or a module) in this process
CODE_BUILTINS = {"eval", "exec", "compile", "__import__", "breakpoint"}
#: module functions that run or load code or objects from data, or hand a string to a shell
CODE_CALLS = {
    "pickle.load",
    "pickle.loads",
    "pickle.Unpickler",
    "marshal.load",
    "marshal.loads",
    "shelve.open",
    "dill.load",
    "dill.loads",
    "cloudpickle.load",
    "cloudpickle.loads",
    "yaml.load",
    "yaml.unsafe_load",
    "yaml.full_load",
    "runpy.run_path",
    "runpy.run_module",
    "code.interact",
    "code.InteractiveInterpreter",
    "code.InteractiveConsole",
    "importlib.import_module",
    "importlib.util.spec_from_file_location",
    "importlib.util.module_from_spec",
    "importlib.machinery.SourceFileLoader",
    "os.system",
    "os.popen",
    "os.execl",
    "os.execlp",
    "os.execv",
    "os.execvp",
    "pty.spawn",
}
#: modules whose import alone is a sink in this package
CODE_MODULES = {"pickle", "marshal", "shelve", "dill", "cloudpickle", "code", "runpy", "imp"}
#: tree walkers that recurse (RecursionError on a deep tree) or follow links unless told otherwise
RECURSIVE_CALLS = {"os.walk", "os.fwalk", "shutil.rmtree", "shutil.copytree", "rglob", "glob"}
#: reads of a stream without a bound
UNBOUNDED_READS = {"readline", "readlines"}

#: every allowed call: (module, what) -> the matrix cell (docs/SECURITY.md) and why it is no sink
ALLOWED: dict[tuple[str, str], str] = {
    ("agent/__init__.py", "importlib.import_module"): (
        "K1: a lazy import of a submodule named by the package's own table _HOMES (the name is checked against "
        "it first): no computed name reaches it"
    ),
    ("testing/overlay.py", "shutil.copytree"): "K3: a test double's copy of the repository's own fixture crates",
    ("testing/overlay.py", "shutil.rmtree"): "K3: a test double's staging of the repository's own fixture crates",
    ("testing/overlay.py", "rglob"): "K3: a test double comparing the repository's own fixture crates",
    ("eval/results.py", "rglob"): "K3: the eval's own records, written by flakebot under the output directory",
    # the unit wrapper is no part of flakebot's process: the stub builds' RUSTC_WRAPPER, run inside the sandbox
    ("sandbox/unit_wrapper.py", "os.execvp"): (
        "K6: inside the sandbox, the rustc cargo names (its own argv) for a question that compiles nothing; no "
        "text of a crate's reaches it"
    ),
    ("sandbox/unit_wrapper.py", "shutil.rmtree"): (
        "K3: inside the sandbox, the private directory it made for one rustc or build script; a tree too deep "
        "fails that unit's build (the dependency cache then builds without it), never flakebot"
    ),
    ("clients/jsonrpc.py", "readline"): (
        "K3: the stdio MCP servers' line reader (flakebot mcp, the bridge); branch i36 caps each line at 4 MiB, "
        "as over HTTP (tests/agent/test_stdio_caps on that branch)"
    ),
}


def _dotted(node: ast.expr) -> str:
    """``a.b.c`` for an attribute chain, the name for a name, "" otherwise."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def _imported_names(tree: ast.Module) -> dict[str, str]:
    """Local name -> the dotted name it was imported as (``from importlib import import_module`` included)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
    return names


def found_sinks() -> Iterator[tuple[str, int, str]]:
    """(module, line, sink) for every sink call, import or reference in the package."""
    for path in sorted(PACKAGE.rglob("*.py")):
        yield from sinks_in(path.relative_to(PACKAGE).as_posix(), path.read_text(encoding="utf-8"))


def sinks_in(module: str, source: str) -> Iterator[tuple[str, int, str]]:
    """(module, line, sink) for every sink call, import or reference in ``source``."""
    if True:
        tree = ast.parse(source)
        aliases = _imported_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                for mod in mods:
                    if mod.split(".")[0] in CODE_MODULES:
                        yield module, node.lineno, f"import {mod}"
            if isinstance(node, ast.Attribute) and node.attr in UNBOUNDED_READS:
                yield module, node.lineno, node.attr
            if not isinstance(node, ast.Call):
                continue
            name = _dotted(node.func)
            head, _, rest = name.partition(".")
            full = f"{aliases[head]}.{rest}".rstrip(".") if head in aliases else name
            if isinstance(node.func, ast.Name) and node.func.id in CODE_BUILTINS and node.func.id not in aliases:
                yield module, node.lineno, node.func.id
            elif full in CODE_CALLS or name in CODE_CALLS:
                yield module, node.lineno, full if full in CODE_CALLS else name
            elif full in RECURSIVE_CALLS or name in RECURSIVE_CALLS:
                yield module, node.lineno, full if full in RECURSIVE_CALLS else name
            elif isinstance(node.func, ast.Attribute) and node.func.attr in ("rglob",):
                yield module, node.lineno, "rglob"
            elif (
                isinstance(node.func, ast.Attribute)
                and node.func.attr == "glob"
                and any(isinstance(a, ast.Constant) and "**" in str(a.value) for a in node.args)
            ):
                yield module, node.lineno, "glob"
            for keyword in node.keywords:
                if keyword.arg == "shell" and not (isinstance(keyword.value, ast.Constant) and not keyword.value.value):
                    yield module, node.lineno, "shell=True"


def test_every_sink_in_the_package_is_a_cell_of_the_matrix() -> None:
    found = sorted(set(found_sinks()))
    unlisted = [f"{module}:{line}: {sink}" for module, line, sink in found if (module, sink) not in ALLOWED]
    assert unlisted == [], (
        "a call that can run text as code, or read a tree or a stream without a bound: make the text data "
        "(stages/accept.py's read_call), walk with host/trees.py, or cap the read; or add it to ALLOWED with its "
        "matrix cell and why:\n" + "\n".join(unlisted)
    )
    stale = sorted(set(ALLOWED) - {(module, sink) for module, _, sink in found})
    assert stale == [], f"allowances that match no call any more (remove them): {stale}"


def test_every_allowance_names_a_cell_of_the_matrix() -> None:
    matrix = SECURITY.read_text(encoding="utf-8")
    for (module, sink), why in ALLOWED.items():
        cell = why.split(":", 1)[0]
        assert f"| **{cell}**" in matrix or f"**{cell}**" in matrix, (
            f"{module} {sink}: {cell} is no column of the matrix"
        )


def test_the_audit_sees_each_kind_of_sink() -> None:
    """The scan itself: each kind it looks for, written every way the package could write it, is seen."""
    source = """
import pickle
from importlib import import_module as im
import shutil, os, subprocess
eval(text)
exec(compile(text, "x", "exec"))
__import__(name)
pickle.loads(data)
im(name)
shutil.rmtree(path)
os.walk(path)
Path(p).rglob("*")
Path(p).glob("**/*.rs")
stream.readline()
subprocess.run(cmd, shell=True)
os.system(cmd)
"""
    seen = {sink for _, _, sink in sinks_in("probe.py", source)}
    assert seen >= {
        "import pickle",
        "eval",
        "exec",
        "compile",
        "__import__",
        "pickle.loads",
        "importlib.import_module",
        "shutil.rmtree",
        "os.walk",
        "rglob",
        "glob",
        "readline",
        "shell=True",
        "os.system",
    }, seen


def test_only_the_persons_doors_make_person_text() -> None:
    """Text is the person's only where the person typed it: the cell, the command line, ``build()``'s argument,
    a suite file they chose to run (and ``keep_origin``, which keeps an origin it was given)."""
    doors = {"magics.py", "cli.py", "__init__.py", "eval/task.py", "request.py"}
    makers: set[str] = set()
    readers: set[str] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and _dotted(node.func).split(".")[-1] == "PersonText":
                makers.add(module)
            if isinstance(node, ast.Call) and _dotted(node.func).split(".")[-1] == "split_request":
                readers.add(module)
    assert makers == doors, f"PersonText is made in {sorted(makers - doors)}, which are not the person's doors"
    # the person's examples are read where a request starts (the pipeline) and where a suite is loaded
    assert readers == {"pipeline/run.py", "eval/task.py"}, sorted(readers)
