"""Hidden global state is a list you can read: every piece of module-level mutable state in the package is named here.

Read from the source (AST), over every module of ``flakebot_magic/``:

* a module-level name bound to a mutable container (a dict, list or set display or comprehension, ``dict()``,
  ``deque()``, a lock, ...) or to an instance of anything not known to be immutable;
* a function or method memoised with ``functools.lru_cache`` / ``functools.cache`` (a cache that never forgets);
* a ``global`` statement (a function rebinding module state).

Each is either a **constant table** (an UPPER_CASE name whose container no module of the package ever mutates:
no item assignment or deletion, no ``append``/``update``/``pop``..., no augmented assignment; checked here) or
an entry of :data:`ALLOWED`, which says what the state is, what bounds it and when it is dropped. An entry that no
longer matches anything fails too, so the list stays true. The check is shown not to be vacuous on code written
the old way (a table keyed by ``repr(settings)``, an ``lru_cache`` probe).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "flakebot_magic"

#: module:name -> why this state is right (what it holds, what bounds it, when it goes)
ALLOWED: dict[str, str] = {
    # -- state with an owner and a bound ----------------------------------------------------------------------
    "stages/deps.py:_FILLS": "the stub builds sealing a finished build's dependencies, one thread each, dropped "
    "once over (wait_for_fills); the process waits for them at exit",
    "stages/deps.py:_FILLS_LOCK": "guards _FILLS",
    "host/deadline.py:_RUNNING": "a ContextVar: the deadline of the call running in this thread or task (each context "
    "its own), set and reset around a call by Deadline.running",
    "edit/ratchet.py:_LONGEST_EMPTY": "a constant: the length of the longest empty body, computed once at import",
    "agent/notebook.py:_AGENTS": "notebook agents, one per kernel (weakly keyed: gone with it) and cache dir, bounded",
    "agent/notebook.py:_NO_SHELL": "the key of a plain interpreter's one 'kernel' (a sentinel, no state)",
    "commands.py:_AUDIENCE": "who reads this process's advice (notebook, shell or both): one string, set by the "
    "extension's load and the command's main",
    "clients/lifecycle.py:_started": "started tool processes by (cache dir, name); one per tool used; stopped at exit",
    "clients/lifecycle.py:_started_lock": "guards _started",
    "clients/lifecycle.py:_atexit_registered": "stop_all registered with atexit once",
    "views/interrupted.py:_LIVE": "builds shown as widgets in this kernel, one per running cell; each leaves when its "
    "run ends (refresh), all at the kernel's exit",
    "views/interrupted.py:_LOCK": "guards _LIVE",
    "views/interrupted.py:_REGISTERED": "interrupt_all registered with atexit once",
    "host/site_defaults.py:_read": "the install's defaults file, keyed by its path and stamp (mtime, size): at most 4, "
    "re-read when the file changes",
    "host/process.py:_spawner": "the one long-lived thread lasting children are forked from (parent-death signal)",
    "host/entry.py:_WHOLE": "store entries last found whole, by the stamp of their files: one per (entry, binary) run",
    "host/entry.py:_LOCK": "guards _WHOLE",
    "host/process.py:_guard": "the one guard process that kills a call's children when this process dies (host/guard.py)",
    "host/process.py:_prctl": "lru_cache(1): libc's prctl, looked up once (the C library does not change)",
    "host/process.py:_launcher": "lru_cache(1): libc's posix_spawn and a call's spawn attributes, made once; "
    "its bounded caches of argv/envp arrays and file actions (a tool's call repeats its own)",
    "records/steering.py:_counter": "steering messages' sequence numbers, unique in the process (one integer)",
    "stages/deploy.py:_LIBC": "the C library's handle (for renameat2), loaded once: no state of flakebot's",
    "host/crashpoints.py:_counts": "test crash points: hits per point, only when FLAKEBOT_CRASH_AT names one",
    "host/crashpoints.py:_lock": "guards _counts",
    "stages/search.py:_NOTICED": "notices said once per process (no semantic search): a handful of fixed strings",
    "stages/search.py:_NOTICED_LOCK": "guards _NOTICED",
    "registry/embedding.py:_ENCODERS": "loaded embedding models by name (one or two; each is hundreds of MB to load)",
    "registry/embedding.py:_ENCODERS_LOCK": "guards _ENCODERS",
    "sandbox/limits.py:_PARENTS": "each controller's cgroup found at first use (the process's own cgroup does not move)",
    "sandbox/cargo.py:_HOME_LOCK": "serialises making a CARGO_HOME (no state)",
    "records/steering.py:_counter_lock": "serialises the steering message counter (no state)",
    "clients/http_net.py:_CALL": "a thread-local: the deadline of the HTTP call this thread is making, set and "
    "restored by call_deadline around it (one float per thread, gone with the thread)",
    "eval/pytest_plugin.py:_outcomes": "the hidden tests' outcomes of the one pytest run this plugin lives in",
    # -- probes of the host, kept while what they probed is unchanged (host/probes.py), bounded -------------
    "sandbox/host.py:_BWRAP_PROBES": "bubblewrap's answer per binary identity (path, inode, mtime); failures 30 s",
    "sandbox/toolchain.py:_TOOLCHAINS": "the toolchain per cargo, while cargo, rustc, rustup settings are the same",
    "sandbox/seccomp.py:_FILTERS": "the compiled filter (fixed inputs), built again when its file is gone",
    "backends/nix_sandbox.py:_SANDBOX_PROBES": "nix's sandbox answer per executable and nix.conf identity",
    # -- pure memos (the answer depends on the arguments alone) ----------------------------------------------
    "clients/http_net.py:_deadline_classes": "cache: the deadline transport's classes, made once (no state)",
    "server/dashboard.py:templates": "cache: the Jinja2 environment of the package's own templates (one object)",
    "host/environment.py:_allowed": "lru_cache(4096): whether a variable name passes the allowlist (pure, bounded)",
    "host/environment.py:_PASSED": "the allowlisted part of os.environ per rule (two), kept while os.environ is unchanged",
}

#: calls whose result is immutable (or a str/bytes/Path/compiled pattern)
IMMUTABLE_CALLS = {
    "frozenset",
    "tuple",
    "str",
    "bytes",
    "int",
    "float",
    "re.compile",
    "struct.Struct",
    "TypeVar",
    "ParamSpec",
    "Path",
    "type",  # a class made from a table (the magic's option traits): a definition, not state
}
#: methods whose result is a new immutable value (a str, a Path)
IMMUTABLE_METHODS = {"join", "format", "hexdigest", "with_name", "with_suffix", "strip", "lower", "upper"}
#: methods that change a container in place
MUTATING_METHODS = {
    "append",
    "extend",
    "add",
    "update",
    "pop",
    "popitem",
    "clear",
    "setdefault",
    "insert",
    "remove",
    "discard",
    "sort",
    "reverse",
    "__setitem__",
    "__delitem__",
}
MEMO_DECORATORS = {"lru_cache", "cache", "functools.lru_cache", "functools.cache"}


def _modules() -> dict[str, ast.Module]:
    return {
        str(path.relative_to(PACKAGE)): ast.parse(path.read_text(encoding="utf-8"))
        for path in sorted(PACKAGE.rglob("*.py"))
        if "suites" not in path.relative_to(PACKAGE).parts  # eval suites: test data for the eval, not the package
    }


def _frozen_classes(modules: dict[str, ast.Module]) -> set[str]:
    """Classes of the package whose instances cannot change: frozen dataclasses, NamedTuples, Enums."""
    frozen = set()
    for tree in modules.values():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = {ast.unparse(b) for b in node.bases}
            decorators = [ast.unparse(d) for d in node.decorator_list]
            if bases & {"NamedTuple", "Enum", "enum.Enum", "str, Enum"} or any("frozen=True" in d for d in decorators):
                frozen.add(node.name)
    return frozen


def _top_level(tree: ast.Module) -> list[ast.stmt]:
    """Module-level statements, looking into module-level ``if``/``try`` blocks."""
    found: list[ast.stmt] = []
    pending = list(tree.body)
    while pending:
        node = pending.pop(0)
        if isinstance(node, ast.If):
            pending += node.body + node.orelse
        elif isinstance(node, ast.Try):
            pending += node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]
        else:
            found.append(node)
    return found


def _is_mutable(value: ast.expr, frozen: set[str]) -> bool:
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return True
    if isinstance(value, ast.Call):
        callee = ast.unparse(value.func)
        if callee in IMMUTABLE_CALLS or callee.split(".")[-1] in frozen:
            return False
        return not (isinstance(value.func, ast.Attribute) and value.func.attr in IMMUTABLE_METHODS)
    return False


def _is_constant_name(name: str) -> bool:
    bare = name.lstrip("_")
    return name == "__all__" or (bare.upper() == bare and any(c.isalpha() for c in bare))


def _mutated_names(modules: dict[str, ast.Module]) -> set[str]:
    """Names (bare or as an attribute) whose container some module changes in place."""
    names: set[str] = set()

    def name_of(node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute):
            return node.attr
        return None

    for tree in modules.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Subscript) and (n := name_of(target.value)):
                        names.add(n)
                    # ``__all__ += other.__all__``: the re-export form type checkers read, run once at import
                    if isinstance(node, ast.AugAssign) and (n := name_of(target)) and n != "__all__":
                        names.add(n)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in MUTATING_METHODS
                and (n := name_of(node.func.value))
            ):
                names.add(n)
    return names


def module_state(modules: dict[str, ast.Module]) -> set[str]:
    """Every piece of module-level state that is not a constant table, as ``module:name``."""
    frozen = _frozen_classes(modules)
    mutated = _mutated_names(modules)
    found: set[str] = set()
    for where, tree in modules.items():
        for node in _top_level(tree):
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            if value is None:
                continue
            for target in targets:
                if not isinstance(target, ast.Name):
                    continue
                name = target.id
                if not _is_mutable(value, frozen):
                    continue
                is_display = not isinstance(value, ast.Call)
                if is_display and _is_constant_name(name) and name not in mutated:
                    continue  # a constant table: nothing changes it
                found.add(f"{where}:{name}")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for decorator in node.decorator_list:
                    called = decorator.func if isinstance(decorator, ast.Call) else decorator
                    if ast.unparse(called) in MEMO_DECORATORS:
                        found.add(f"{where}:{node.name}")
            elif isinstance(node, ast.Global):
                found.update(f"{where}:{name}" for name in node.names)
    return found


def test_every_piece_of_module_state_is_named_with_its_reason() -> None:
    found = module_state(_modules())
    unlisted = sorted(found - set(ALLOWED))
    assert unlisted == [], (
        "module-level state not in ALLOWED (tests/test_module_state.py): give it an owner instead (an object a front "
        "door holds), or list it with what bounds it and when it goes:\n" + "\n".join(unlisted)
    )
    stale = sorted(set(ALLOWED) - found)
    assert stale == [], f"ALLOWED names state that is no longer there: {stale}"


def test_the_check_finds_what_it_forbids() -> None:
    old_way = ast.parse(
        "from functools import lru_cache\n"
        "_AGENTS: dict[str, object] = {}\n"
        "TABLE = {'a': 1}\n"
        "COUNTS = {}\n"
        "def agent(settings):\n"
        "    global _LAST\n"
        "    COUNTS[repr(settings)] = 1\n"
        "    return _AGENTS.setdefault(repr(settings), object())\n"
        "@lru_cache(maxsize=4)\n"
        "def probe(binary): ...\n"
        "_QUEUE = collections.deque()\n"
        "PATTERN = re.compile('x')\n"
    )
    assert module_state({"old.py": old_way}) == {
        "old.py:_AGENTS",  # lower-case and changed in place
        "old.py:COUNTS",  # an UPPER_CASE name, but changed in place: no constant
        "old.py:_LAST",  # rebound through `global`
        "old.py:probe",  # memoised forever
        "old.py:_QUEUE",  # a container made by a call
    }
