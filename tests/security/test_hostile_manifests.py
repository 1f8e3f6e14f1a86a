"""Every door that parses untrusted TOML or JSON turns any document into a result or its clear error (issue 33, B).

Red team 33: a polyglot exercise's ``Cargo.toml`` that ``tomllib`` reads and ``tomlkit`` chokes on
(``[package]\\nmetadata = 1``, ``package = { name = "evil", ... }``) raised a traceback that ended the whole
eval. The class is wider than one parser: what a document *holds* is as untrusted as its syntax. The property,
over hypothesis-made hostile documents (random text, and TOML whose every table may be an inline table, a
scalar or an array, with the text of ``[package]`` and its ``metadata`` varied), at each door:

* ``load_toml``, ``edit_toml``, ``load_json``: a value, or ``ValueError``;
* a polyglot checkout's ``Cargo.toml`` and ``.meta/config.json`` (``eval/polyglot.py``): a task whose staged
  manifest reads back with the tool contract, or a problem that says why;
* a published crate's ``Cargo.toml`` edited by the fork (``stages/fork.py``): done, or a ``ForkError``;
* a registry crate's manifest (``registry/crate_files.py``): read, or ``ValueError``; its binaries listed;
* a crate's tool contract (``clients/contract.py``): read, or a ``FlakebotError``;
* a suite's TOML (``eval/task.py``): read, or ``ValueError``.
"""

from __future__ import annotations

import ast
import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from package_calls import package_calls

from flakebot_magic.errors import FlakebotError, ForkError
from flakebot_magic.host.fsutil import load_json, load_toml

HOSTILE = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_KEYS = st.sampled_from(["name", "version", "metadata", "edition", "path", "test", "flakebot", "kind", "bin", "x"])
_SCALARS = st.one_of(
    st.integers(-(2**70), 2**70),
    st.booleans(),
    st.text(max_size=12),
    st.sampled_from(["evil", "../x", 'a"b', "1.0.0", "cli", "{}", "\n"]),
    st.floats(allow_nan=False, allow_infinity=False),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_KEYS, inner, max_size=3)),
    max_leaves=8,
)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"


@st.composite
def hostile_manifests(draw: st.DrawFn) -> str:
    """A manifest-shaped TOML text: each table a header, an inline table, a scalar, an array of tables."""
    lines = []
    for table in draw(
        st.lists(
            st.sampled_from(
                [
                    "package",
                    "package.metadata",
                    "package.metadata.flakebot",
                    "dependencies",
                    "dev-dependencies",
                    "target",
                    "target.x.dependencies",
                    "features",
                    "lib",
                    "bin",
                    "test",
                    "example",
                ]
            ),
            unique=True,
            max_size=6,
        )
    ):
        body = draw(st.dictionaries(_KEYS, _VALUES, max_size=4))
        if table == "package" and draw(st.booleans()):
            body.setdefault("name", draw(st.sampled_from(["evil", "ok-name", "../../x", 'q"); x("', "a" * 70])))
            body.setdefault("version", "1.0.0")
        form = draw(st.sampled_from(["header", "inline", "scalar", "array"]))
        if form == "header":
            lines.append(f"[{table}]")
            lines += [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in body.items()]
        elif form == "inline":
            lines.insert(0, f"{json.dumps(table)} = {_toml_value(body)}")
        elif form == "scalar":
            lines.insert(0, f"{json.dumps(table)} = {_toml_value(draw(_SCALARS))}")
        else:
            lines.append(f"[[{table}]]")
            lines += [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in body.items()]
    text = "\n".join(lines) + "\n"
    return text + draw(st.sampled_from(["", "", "\n[package]\n", "x = [", "\x00", "a.b = 1\n[a]\n"]))


DOCUMENTS = st.one_of(hostile_manifests(), st.text(max_size=200))
#: the red team's, and the shapes around them
RED_TEAM = [
    '[package]\nname = "evil"\nversion = "1.0.0"\nmetadata = 1\n',
    'package = { name = "evil", version = "1.0.0" }\n',
    '[package]\nname = "evil"\nversion = "1.0.0"\n[package.metadata]\nflakebot = 3\n',
    '[package]\nname = "evil"\nversion = "1.0.0"\n[dependencies]\nfoo = 1\n[target]\nx = []\n',
    '[package]\nname = "evil"\nversion = "1.0.0"\ndev-dependencies = "x"\n[features]\na = 5\n',
]


@contextmanager
def _scratch() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hostile-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@HOSTILE
@given(DOCUMENTS)
def test_the_parsers_give_a_value_or_a_value_error(text: str) -> None:
    from flakebot_magic.host.fsutil import edit_toml

    for parse in (load_toml, edit_toml, load_json):
        try:
            parse(text)
        except ValueError:
            pass


def _exercise(root: Path, manifest: str, config: str | None = None) -> Path:
    exercise = root / "rust" / "exercises" / "practice" / "ex"
    (exercise / ".docs").mkdir(parents=True)
    (exercise / "src").mkdir()
    (exercise / "tests").mkdir()
    (exercise / ".docs" / "instructions.md").write_text("Do it.\n")
    (exercise / "src" / "lib.rs").write_text("pub fn f() {}\n")
    (exercise / "tests" / "ex.rs").write_text("#[test]\nfn t() {}\n")
    (exercise / "Cargo.toml").write_text(manifest, encoding="utf-8", errors="surrogatepass")
    if config is not None:
        (exercise / ".meta").mkdir()
        (exercise / ".meta" / "config.json").write_text(config, encoding="utf-8", errors="surrogatepass")
    return root / "rust"


def _check_polyglot(manifest: str, config: str | None = None) -> None:
    from flakebot_magic.eval.polyglot import polyglot_suite

    with _scratch() as root:
        staging = root / "out" / "polyglot"
        suite = polyglot_suite(_exercise(root, manifest, config), staging)
        assert len(suite.tasks) + len(suite.problems) == 1
        for task in suite.tasks:
            assert task.source is not None and task.source.is_relative_to(staging)
            staged = load_toml(task.source / "Cargo.toml")
            assert staged["package"]["metadata"]["flakebot"] == {"kind": "cli", "bin": task.crate}
        outside = {p for p in root.rglob("*") if not p.is_relative_to(root / "rust") and not p.is_relative_to(staging)}
        assert outside <= {root / "out"}, f"written outside the staging directory: {sorted(outside)}"


@pytest.mark.parametrize("manifest", RED_TEAM)
def test_the_red_teams_manifests_are_each_a_problem_or_a_task(manifest: str) -> None:
    _check_polyglot(manifest)


@HOSTILE
@given(hostile_manifests())
def test_a_polyglot_checkouts_manifest_is_a_task_or_a_problem(manifest: str) -> None:
    _check_polyglot(manifest)


@HOSTILE
@given(
    st.one_of(
        st.text(max_size=100),
        st.recursive(
            _SCALARS,
            lambda i: st.lists(i) | st.dictionaries(st.sampled_from(["files", "test", "example", "solution"]), i),
            max_leaves=10,
        ).map(json.dumps),
    )
)
@example('{"files": {"test": 5, "example": [1], "solution": {"a": 1}}}')
@example('{"files": {"test": ["../../../etc/passwd"]}}')
def test_a_polyglot_checkouts_config_is_a_task_or_a_problem(config: str) -> None:
    _check_polyglot('[package]\nname = "ex"\nversion = "1.0.0"\nedition = "2021"\n', config)


class _Registry:
    id = "hostile-test-registry"
    offline = True

    def can_satisfy(self, name: str, requirement: str) -> bool:
        return name.startswith("ok")


def _check_fork(manifest: str) -> None:
    from flakebot_magic.stages.fork import _make_satisfiable

    with _scratch() as root:
        (root / "Cargo.toml").write_text(manifest, encoding="utf-8", errors="surrogatepass")
        (root / "src").mkdir()
        (root / "src" / "lib.rs").write_text("mod a;\nuse x::y;\n")
        (root / "tests").mkdir()
        (root / "tests" / "t.rs").write_text("use x::y;\n#[test]\nfn t() {}\n")
        workspace = SimpleNamespace(
            path=root, crate=SimpleNamespace(id="hostile@1.0.0"), dropped=[], skipped_targets=[]
        )
        git = SimpleNamespace(commit=lambda *a, **k: True)
        bus = SimpleNamespace(notice=lambda *a, **k: None)
        try:
            _make_satisfiable(workspace, _Registry(), git, bus)  # type: ignore[arg-type]
        except ForkError:
            return
        load_toml(root / "Cargo.toml")  # what it wrote, cargo can read


@pytest.mark.parametrize("manifest", RED_TEAM)
def test_the_fork_edits_the_red_teams_manifests_or_says_why(manifest: str) -> None:
    _check_fork(manifest)


@HOSTILE
@given(hostile_manifests())
def test_the_fork_edits_any_published_manifest_or_says_why(manifest: str) -> None:
    _check_fork(manifest)


@HOSTILE
@given(DOCUMENTS)
@example(RED_TEAM[0])
@example(RED_TEAM[1])
def test_a_registry_crates_manifest_and_contract_are_read_or_refused(manifest: str) -> None:
    from flakebot_magic.clients.contract import read_contract
    from flakebot_magic.eval.task import read_manifest as read_suite_toml
    from flakebot_magic.registry.crate_files import read_manifest, tool_binaries

    with _scratch() as root:
        (root / "Cargo.toml").write_text(manifest, encoding="utf-8", errors="surrogatepass")
        (root / "src").mkdir()
        (root / "src" / "main.rs").write_text("fn main() {}\n")
        try:
            tool_binaries(root, read_manifest(root / "Cargo.toml"))
        except ValueError:
            pass
        try:
            read_contract(root / "Cargo.toml")
        except FlakebotError:
            pass
        try:
            read_suite_toml(root, "Cargo.toml")
        except ValueError:
            pass


def test_the_package_has_one_editing_parser_and_one_reading_parser_per_format() -> None:
    """``tomlkit.parse``, ``tomllib.loads`` and ``json.loads`` are called only in host/fsutil.py (and the test
    doubles, and the unit cache's rustc wrapper: a stdlib-only script run inside the sandbox, where the package is
    not importable): every door goes through load_toml, edit_toml and load_json, whose errors are ValueErrors."""
    found = []
    skipped = ("testing/", "eval/suites/", "host/fsutil.py", "sandbox/unit_wrapper.py")
    for module, node in package_calls(skip=skipped):
        if isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
            name = f"{node.func.value.id}.{node.func.attr}"
            if name in ("tomlkit.parse", "tomlkit.loads", "tomllib.loads", "tomllib.load", "json.loads", "json.load"):
                found.append(f"{module}:{node.lineno}: {name}")
    assert found == [], "parse untrusted TOML/JSON with host/fsutil's load_toml, edit_toml or load_json:\n" + "\n".join(
        found
    )


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["id", "result", "error", "method", "params", "tools", "code", "data"]), inner, max_size=4
        )
    ),
    max_leaves=10,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_JSON, min_size=1, max_size=3))
@example([{"jsonrpc": "2.0", "method": "notifications/message", "params": [1]}])
@example([{"jsonrpc": "2.0", "id": "p", "method": 5}])
def test_a_deployed_mcp_servers_messages_are_an_answer_or_a_tool_error(messages: list[Any]) -> None:
    """The MCP client's door (S4: a tool's output): a server that answers ``tools/list`` with messages of any
    JSON shape before (or instead of) its answer gives a result or a ToolError, never another exception."""
    import os
    import sys

    from stdio_servers import mcp_server

    from flakebot_magic.clients.lifecycle import LogBuffer
    from flakebot_magic.clients.mcp import McpSession

    with _scratch() as root:
        lines = "".join(json.dumps(m) + "\n" for m in messages)
        body = f"sys.stdout.write({lines!r}); sys.stdout.flush()\nprint(json.dumps({{'jsonrpc': '2.0', 'id': m['id'], 'result': {{'tools': []}}}}), flush=True)"
        server = mcp_server(root / "server.py", body)
        session = McpSession([sys.executable, str(server)], env=dict(os.environ), name="s", logs=LogBuffer())
        try:
            session.request("tools/list", timeout=10)
        except FlakebotError:
            pass
        finally:
            session.stop()
