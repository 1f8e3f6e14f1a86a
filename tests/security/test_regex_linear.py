"""Every regular expression in the package runs in linear time on hostile text (issue 33, class E).

The host's Python runs regular expressions on text it does not trust: a model's reply, a crate's files, a
registry's README, a tool's ``--help``. Before this test, five of them backtracked super-linearly: the test
ratchet's ``_BLANKABLE`` on an unterminated ``/*`` (120 KB: 27.7 s), ``^\\s*...`` with ``re.M`` over blank lines
(``edit/prompt.py``, ``stages/choose.py``, ``stages/fork.py``, ``registry/crate_files.py``: 60 KB, 3 to 59 s).

The audit here is structural, so a new pattern is covered the day it is written:

* it reads the package's AST for every call of the ``re`` module (``re.compile`` and the inline ``re.search``,
  ``re.sub``, ... with their flags), at module level, in a class or in a function;
* each call's pattern is its literal, or (for a pattern built from constants, ``f"{_STRING}|..."``) the compiled
  object the module holds under the name it is assigned to; a pattern neither can be (built at run time) must be
  listed in :data:`DYNAMIC` with why it is linear;
* every pattern is run (``finditer`` to the end, ``match`` and ``fullmatch``: every way the package uses one) on a
  family of ~100 KB hostile inputs: blank lines, whitespace runs, each of the pattern's own literal runs
  repeated, alone and followed by whitespace, newlines or letters, and unterminated delimiters. Each run has a
  time budget (a linear pattern takes milliseconds; a quadratic one seconds to hours), enforced with SIGALRM, so a
  catastrophic pattern fails fast instead of hanging the suite.
"""

from __future__ import annotations

import ast
import importlib
import re
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

try:  # Python 3.11+
    from re import _parser as sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse  # type: ignore[no-redef]

PACKAGE = Path(__file__).resolve().parents[2] / "flakebot_magic"
SUITES = PACKAGE / "eval" / "suites"
#: the size of each hostile input, in characters (bytes for a bytes pattern)
SIZE = 100_000
#: the most one run (one pattern, one input, one method) may take; a linear run on 100 KB takes milliseconds
BUDGET = 1.5
#: a run that takes this long is timed again on a quarter of its input: more than GROWTH times longer is super-linear
FLOOR = 0.15
GROWTH = 9.0
#: the ``re`` functions whose first argument is a pattern
RE_FUNCTIONS = {"compile", "search", "match", "fullmatch", "findall", "finditer", "sub", "subn", "split"}
#: a pattern's method (or ``re``'s function) -> the run that costs what it costs: every start, or one
RUN_OF = {
    "search": "finditer",
    "sub": "finditer",
    "subn": "finditer",
    "findall": "finditer",
    "finditer": "finditer",
    "split": "finditer",
    "match": "match",
    "fullmatch": "fullmatch",
}
ALL_RUNS = ("finditer", "match", "fullmatch")

#: patterns built at run time (no literal, no module-level object to read): (module, line of the call) -> why linear
DYNAMIC: dict[tuple[str, str], str] = {
    ("stages/fork.py", "_uses"): (
        "an alternation of re.escape'd identifiers between \\b and '::' / 'extern crate' / 'use': no quantifier "
        "over a repeated group; run below with the identifiers of a fork"
    ),
    ("eval/reference.py", "_has_header"): "re.escape of a TOML header, then [ \\t]*$ under re.M: one line per start",
    ("records/units.py", "_inside_unit"): (
        "fullmatch of [A-Za-z0-9_]+ then '-' and a re.escape'd hash (the class has no '-': one way to split), then "
        "an optional extension"
    ),
    ("sandbox/stub.py", "_neutral_lock"): (
        "re.escape'd literals (a package's name and version) between fixed text, anchored at a line's start under "
        "re.M, no quantifier but the literal's own"
    ),
    ("sandbox/unit_wrapper.py", "run_rustc"): (
        "fullmatch of an optional 'lib', re.escape'd crate name and metadata suffix, an optional extension: one way"
    ),
}


@dataclass(frozen=True)
class Site:
    """One call of the ``re`` module in the package, and the pattern it compiles."""

    module: str
    line: int
    where: str  # the function (or class) it is in, "" at module level
    pattern: re.Pattern[Any] | None
    #: how the module runs it: ``finditer`` (search, sub, findall, split too), ``match``, ``fullmatch``
    methods: tuple[str, ...] = ("finditer", "match", "fullmatch")

    def __str__(self) -> str:
        return f"{self.module}:{self.line} ({self.where or 'module'})"


def _flags(node: ast.expr | None) -> int:
    """The value of a flags expression made of ``re.X`` names and ``|``."""
    if node is None:
        return 0
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _flags(node.left) | _flags(node.right)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "re":
        return int(getattr(re, node.attr))
    raise ValueError(f"flags not made of re.X names: {ast.dump(node)}")


def _literal(node: ast.expr) -> str | bytes | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
        return node.value
    return None


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _held(module: Any, owner: str, target: str) -> re.Pattern[Any] | None:
    """The compiled pattern ``module`` holds as ``target`` (in class ``owner`` when given)."""
    holder = getattr(module, owner, None) if owner else module
    value = getattr(holder, target, None) if holder is not None else None
    return value if isinstance(value, re.Pattern) else None


def _visit(node: ast.AST, scope: str, kind: str, owners: dict[int, tuple[str, str, str]]) -> None:
    """Each call under ``node`` -> (the function or class it is in, which of the two, the name it is bound to)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            _visit(child, child.name, "function", owners)
        elif isinstance(child, ast.ClassDef):
            _visit(child, child.name, "class", owners)
        else:
            target = ""
            if isinstance(child, ast.Assign) and len(child.targets) == 1:
                if isinstance(child.targets[0], ast.Name):
                    target = child.targets[0].id
            elif isinstance(child, ast.AnnAssign) and isinstance(child.target, ast.Name):
                target = child.target.id
            for inner in ast.walk(child):
                if isinstance(inner, ast.Call):
                    owners.setdefault(id(inner), (scope, kind, target))
            if not isinstance(child, ast.stmt):
                continue
            _visit(child, scope, kind, owners)


def sites() -> Iterator[Site]:
    """Every call of the ``re`` module in the package, with its compiled pattern when it can be had."""
    for path in sorted(PACKAGE.rglob("*.py")):
        if SUITES in path.parents:  # the built-in suites' hidden tests: the suite author's code, run in a child
            continue
        module_path = path.relative_to(PACKAGE).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        module: Any = None
        # where each call is: the enclosing function or class, and the name a module/class-level call is bound to
        owners: dict[int, tuple[str, str, str]] = {}

        _visit(tree, "", "module", owners)
        # NAME.method(...) and self.NAME.method(...): how the module runs each pattern it binds to a name
        used: dict[str, set[str]] = {}
        as_method: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in RUN_OF:
                holder = node.value
                as_method.add(id(holder))
                name = holder.id if isinstance(holder, ast.Name) else getattr(holder, "attr", "")
                used.setdefault(name, set()).add(RUN_OF[node.attr])
        # a name loaded any other way (stored in a table, passed on): its runs are not known, so every run counts
        passed = {
            node.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and id(node) not in as_method
        }
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "re"
                and node.func.attr in RE_FUNCTIONS
                and node.args
            ):
                continue
            scope, kind, target = owners.get(id(node), ("", "module", ""))
            flag_node = next((k.value for k in node.keywords if k.arg == "flags"), None)
            if flag_node is None:
                index = {"compile": 1, "search": 2, "match": 2, "fullmatch": 2, "findall": 2, "finditer": 2}
                at = index.get(node.func.attr, 4 if node.func.attr in ("sub", "subn") else 3)
                flag_node = node.args[at] if len(node.args) > at else None
            text = _literal(node.args[0])
            if node.func.attr != "compile":
                methods: tuple[str, ...] = (RUN_OF[node.func.attr],)
            elif target and target in used and target not in passed:
                methods = tuple(sorted(used[target]))
            else:
                methods = ALL_RUNS
            pattern: re.Pattern[Any] | None = None
            if text is not None:
                pattern = re.compile(text, _flags(flag_node))
            elif node.func.attr == "compile" and target and kind in ("module", "class"):
                if module is None:
                    module = importlib.import_module(_module_name(path))
                pattern = _held(module, scope if kind == "class" else "", target)
            yield Site(module_path, node.lineno, scope, pattern, methods)


def _literal_runs(pattern: re.Pattern[Any]) -> set[str]:
    """The pattern's own literal text: each run of consecutive literal characters, and each single one."""
    source = pattern.pattern if isinstance(pattern.pattern, str) else pattern.pattern.decode("latin-1")
    runs: set[str] = set()

    def walk(items: Any) -> None:
        run: list[str] = []
        for op, arg in items:
            name = str(op)
            if name == "LITERAL":
                run.append(chr(arg))
                continue
            if run:
                runs.add("".join(run))
                runs.update(run)
                run = []
            if name == "IN":
                for inner_op, inner_arg in arg:
                    if str(inner_op) == "LITERAL":
                        runs.add(chr(inner_arg))
                    elif str(inner_op) == "RANGE":
                        runs.add(chr(inner_arg[0]))
            elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
                walk(arg[2])
            elif name == "SUBPATTERN":
                walk(arg[-1])
            elif name == "BRANCH":
                for branch in arg[1]:
                    walk(branch)
            elif name in ("ASSERT", "ASSERT_NOT"):
                walk(arg[1])
            elif name == "ATOMIC_GROUP":
                walk(arg)
        if run:
            runs.add("".join(run))
            runs.update(run)

    walk(sre_parse.parse(source, pattern.flags & ~re.UNICODE if isinstance(pattern.pattern, bytes) else 0))
    return {r for r in runs if r}


#: the delimiters an unterminated construct starts with, and the text that fills a line
_DELIMITERS = ('"', '\\"', "'", "/*", "//", "`", "```\n", "[", "(", "{", "<", "<!--", "#", "-", "--", 'r#"', "=")
_FILLERS = ("\n", " ", "\t", " \n", "\r\n", "\n\n ", "a", "A", "0", "_", "x ", "a\n", ". ", "\\", "*/")


def hostile_inputs(pattern: re.Pattern[Any]) -> Iterator[tuple[str, str]]:
    """(name, text) of ~:data:`SIZE` characters each: what makes a backtracking engine go super-linear."""

    def fill(unit: str) -> str:
        return unit * max(1, SIZE // max(1, len(unit)))

    for unit in _FILLERS:
        yield f"{unit!r} repeated", fill(unit)
    for delimiter in _DELIMITERS:
        yield f"{delimiter!r} repeated", fill(delimiter)
        yield f"{delimiter!r} then letters", delimiter + fill("a")
        yield f"{delimiter!r}+x repeated", fill(delimiter + "x")
    for run in sorted(_literal_runs(pattern)):
        yield f"{run!r} repeated", fill(run)
        for after in ("\n", " ", "a", "\n\n", " \n", "-", run[:1]):
            yield f"{run!r}+{after!r} repeated", fill(run + after)
        yield f"{run!r} then blank lines", run + fill("\n")
        yield f"{run!r} then spaces", run + fill(" ")
        yield f"{run!r} then letters", run + fill("a")
        yield f"blank lines then {run!r}", fill("\n") + run


class _Slow(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Slow


def _run(pattern: re.Pattern[Any], subject: str | bytes, method: str, budget: float) -> float | None:
    """Seconds ``method`` took on ``subject``, or None when it ran past ``budget`` (stopped by SIGALRM)."""
    started = time.monotonic()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, budget)
    try:
        if method == "finditer":
            for _ in pattern.finditer(subject):
                pass
        else:
            getattr(pattern, method)(subject)
    except _Slow:
        return None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return time.monotonic() - started


def time_runs(pattern: re.Pattern[Any], text: str, methods: tuple[str, ...] = ALL_RUNS) -> tuple[str, float] | None:
    """The first of ``methods`` (``finditer``, ``match``, ``fullmatch``) that is super-linear on ``text``: over
    :data:`BUDGET`, or over :data:`FLOOR` and more than :data:`GROWTH` times what a quarter of ``text`` takes
    (linear is 4 times, quadratic 16: a quadratic scan in a tight loop is caught under the budget too)."""
    subject: str | bytes = text.encode("latin-1", "replace") if isinstance(pattern.pattern, bytes) else text
    for method in methods:
        took = _run(pattern, subject, method, BUDGET)
        if took is None:
            return method, BUDGET
        if took >= FLOOR:  # the best of two runs each, so a busy machine's pause is not taken for growth
            again = _run(pattern, subject, method, BUDGET)
            full = min(took, BUDGET if again is None else again)
            quarters = [_run(pattern, subject[: len(subject) // 4], method, BUDGET) or BUDGET for _ in range(2)]
            if full >= FLOOR and full / max(min(quarters), 1e-3) > GROWTH:
                return method, full
    return None


ALL_SITES = list(sites())


def test_every_call_of_re_has_a_pattern_the_audit_can_run() -> None:
    """A pattern is a literal, a module's or class's compiled constant, or listed in DYNAMIC with why."""
    unresolved = [f"{site}" for site in ALL_SITES if site.pattern is None and (site.module, site.where) not in DYNAMIC]
    assert unresolved == [], (
        "a regular expression the audit cannot run: write its pattern as a literal or a module-level constant, "
        "or list it in DYNAMIC with why it is linear:\n" + "\n".join(unresolved)
    )
    stale = sorted(set(DYNAMIC) - {(s.module, s.where) for s in ALL_SITES if s.pattern is None})
    assert stale == [], f"DYNAMIC names calls that are gone or now resolved (remove them): {stale}"
    assert len([s for s in ALL_SITES if s.pattern is not None]) >= 80, "the audit found too few patterns to be right"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("site", [s for s in ALL_SITES if s.pattern is not None], ids=lambda s: f"{s.module}:{s.line}")
def test_every_pattern_is_linear_on_hostile_text(site: Site) -> None:
    assert site.pattern is not None
    slow = []
    for name, text in hostile_inputs(site.pattern):
        found = time_runs(site.pattern, text, site.methods)
        if found is not None:
            slow.append(f"{found[0]} on {name}: {found[1]:.1f} s, super-linear")
            break  # one is enough to fail; the rest would each cost the budget again
    assert slow == [], (
        f"{site}: /{site.pattern.pattern!r}/ backtracks super-linearly on {SIZE // 1000} KB of hostile text "
        "(use [ \\t]* for indentation under re.M, end an unterminated construct at \\Z, or bound the input):\n"
        + "\n".join(slow)
    )


def test_the_runtime_built_patterns_are_linear_too() -> None:
    """DYNAMIC's patterns, built as the package builds them."""
    from flakebot_magic.eval.reference import _has_header
    from flakebot_magic.stages.fork import _uses

    idents = {"proptest", "quickcheck", "criterion_macros"}
    for name, text in hostile_inputs(re.compile(r"proptest::|extern crate quickcheck|use criterion_macros")):
        started = time.monotonic()
        _uses([text], idents)
        assert time.monotonic() - started < BUDGET * 2, f"fork's _uses on {name}"
    for name, text in hostile_inputs(re.compile(r"\[dependencies\]|\[target\.x\.dependencies\]")):
        started = time.monotonic()
        _has_header(text, ("target", "x", "dependencies"))
        assert time.monotonic() - started < BUDGET * 2, f"reference's _has_header on {name}"


def test_the_audit_sees_a_quadratic_pattern() -> None:
    """The audit itself: the shapes issue 33's red team found are slow on some input of the family, at once."""
    for shape in (r"^\s*pub\s+fn", r"/\*.*?\*/", r"\{.*\}"):
        flags = re.M if shape.startswith("^") else re.S
        pattern = re.compile(shape, flags)
        assert any(time_runs(pattern, text) for _, text in hostile_inputs(pattern)), shape
