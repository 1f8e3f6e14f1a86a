"""The table of tool kinds (``clients/kinds.KINDS``): no module compares kind names, and a kind is one module and one
row (issue 38, item 1).

* Structural: the package is read (AST) for a comparison of a tool's kind with a kind's name (``record.kind !=
  "cli"``, ``tool["kind"] in ("http", "mcp")``), a table keyed by kind names outside the kinds' own table
  (``{"cli": ..., "http": ...}``), and a kind's client class tested with ``isinstance`` outside its module: each
  is a decision about kinds made outside the table. On main: 15 such comparisons (in 8 modules) and 2 tables.
* The table: each row is a client class whose ``kind`` is its key, with a person's words and a model's contract;
  the default kind is asked for by any request, every other kind by words of its own.
* A kind added as the docs say (``tests/oneshot_kind.py``: one module, one row) that runs only when called is
  never started or stopped like a server: not by the factory, a build, ``load``, ``stop``, ``stop`` of every
  tool, the logs or the dashboard; the contract reader, the prompt, the request rule, the bridge's words and
  ``usage()`` know it; and it is confined through every door (the invariant test's doors).
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from kindtools import CHILD_PRELUDE, CONFINED, DOORS, HOSTILE, Host, applies, planted
from oneshot_kind import JsonCallTool, add_row

from flakebot_magic.clients import kinds as kinds_module
from flakebot_magic.clients import lifecycle, make_tool
from flakebot_magic.clients.base import DEFAULT_KIND, ToolClient
from flakebot_magic.clients.contract import read_contract
from flakebot_magic.clients.kinds import KINDS, asked_kinds, for_model, is_server, kind_of, unasked
from flakebot_magic.config import Settings
from flakebot_magic.errors import DeployError

PACKAGE = Path(__file__).resolve().parents[2] / "flakebot_magic"
#: the table's own module, where the rows are listed
TABLE = PACKAGE / "clients" / "kinds.py"


# -- structural ---------------------------------------------------------------------------------------------------


def _kindish(node: ast.expr) -> bool:
    """An expression that reads a tool's kind: ``x.kind``, ``x["kind"]``, ``x.get("kind")``, a name ``kind``."""
    if isinstance(node, ast.Attribute):
        return node.attr == "kind"
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "kind"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        return bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "kind"
    if isinstance(node, ast.Name):
        return node.id == "kind"
    if isinstance(node, ast.BoolOp):  # contract.get("kind") or "cli"
        return any(_kindish(value) for value in node.values)
    if isinstance(node, ast.Call):  # str(record.kind), kind.lower()
        inner = [*node.args, *([node.func.value] if isinstance(node.func, ast.Attribute) else [])]
        return any(_kindish(arg) for arg in inner)
    return False


def _names_a_kind(node: ast.expr, names: set[str]) -> bool:
    """A kind's name written out: ``"http"``, or a tuple, list or set holding one."""
    if isinstance(node, ast.Constant):
        return node.value in names
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_kind(item, names) for item in node.elts)
    return False


#: what may be compared with a word that is also a kind's name, and what it is instead
NOT_KINDS = {
    "scheme": "a URL's scheme (a nix flake reference's)",
    "target.scheme": "a URL's scheme (the server proxy's target)",
    "args.command": "the flakebot command's subcommand `mcp` (flakebot's own MCP server)",
}


def kind_decisions(source: str, names: set[str], classes: set[str], own: set[str] = frozenset()) -> list[str]:  # type: ignore[assignment]
    """Each decision about tool kinds ``source`` makes outside the table: ``line: what``.

    ``names``: the kinds' names; ``classes``: their client classes' names; ``own``: the classes this module
    defines (a class may test for itself).
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            named = [side for side in sides if _names_a_kind(side, names)]
            others = {ast.unparse(side) for side in sides if side not in named}
            if named and (any(_kindish(side) for side in sides) or not others <= set(NOT_KINDS)):
                found.append(f"{node.lineno}: compares with a kind's name: {ast.unparse(node)}")
        elif isinstance(node, ast.Dict):
            keyed = [key for key in node.keys if key is not None and _names_a_kind(key, names)]
            if keyed:
                found.append(f"{node.lineno}: a table keyed by kind names: {ast.unparse(node)[:80]}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("isinstance", "issubclass")
        ):
            named = {n.id for arg in node.args[1:] for n in ast.walk(arg) if isinstance(n, ast.Name)}
            if named & (classes - own):
                found.append(f"{node.lineno}: tests for a kind's client class: {ast.unparse(node)}")
        elif isinstance(node, ast.MatchValue) and _names_a_kind(node.value, names):
            found.append(f"{node.lineno}: matches a kind's name: {ast.unparse(node.value)}")
    return found


def _package_decisions() -> dict[str, list[str]]:
    names = set(KINDS)
    classes = {kind.__name__ for kind in KINDS.values()}
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == TABLE or "suites" in path.parts:  # the table itself; the eval suites' task files are data
            continue
        source = path.read_text(encoding="utf-8")
        own = {n.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef)}
        decisions = kind_decisions(source, names, classes, own)
        if decisions:
            found[str(path.relative_to(PACKAGE))] = decisions
    return found


def test_no_module_decides_by_a_kinds_name() -> None:
    assert _package_decisions() == {}, (
        "decide by the kind's row instead (clients/kinds.py: kind_of(name).server, is_server, proxied, a_noun ...); "
        "see docs/ARCHITECTURE.md, 'Adding a tool kind'"
    )


def test_the_check_finds_what_main_wrote() -> None:
    """Not vacuous: the forms main used are each found (deployed.py, dashboard.py, base.py, factory.py, doctor.py)."""
    old = textwrap.dedent(
        """
        if tool.kind != "cli":
            pass
        stoppable = self.tool["kind"] in ("http", "mcp")
        _KIND_WORDS = {"cli": "command-line tool", "http": "HTTP service"}
        if contract.kind == "mcp":
            pass
        kind = str(contract.get("kind") or "cli") == "cli"
        if isinstance(tool, HttpTool):
            pass
        match record.kind:
            case "http":
                pass
        """
    )
    found = kind_decisions(old, set(KINDS), {"HttpTool"})
    assert len(found) == 7, found
    # a dependency's kind, a URL's scheme, a subcommand's name: not tool kinds
    assert (
        kind_decisions(
            'if d.kind != "dev": pass\nok = scheme in ("http", "https")\nargs.command == "mcp"',
            set(KINDS),
            {"HttpTool"},
        )
        == []
    )


# -- the table -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(KINDS))
def test_each_row_is_a_client_class_that_says_how_its_kind_behaves(name: str) -> None:
    kind = KINDS[name]
    assert issubclass(kind, ToolClient) and kind.kind == name
    assert kind.noun and kind.a_noun.endswith(kind.noun.split(" (")[0]) and kind.contract_text
    assert isinstance(kind.server, bool) and isinstance(kind.bridged, bool) and isinstance(kind.proxied, bool)
    assert (kind.asked_by is None) == (name == DEFAULT_KIND), "only the default kind is asked for by any request"
    assert kind_of(name) is kind


def test_the_first_row_is_the_default_kind_and_an_unknown_name_is_said_clearly() -> None:
    assert next(iter(KINDS)) == DEFAULT_KIND
    with pytest.raises(
        DeployError, match=rf"'nope' is not a tool kind this flakebot knows \(it knows {', '.join(KINDS)}\)"
    ):
        kind_of("nope")
    assert not is_server("nope")


@pytest.mark.parametrize(
    ("request_text", "asked"),
    [
        ("Render Markdown to HTML.", ["cli"]),
        ("An MCP server that adds numbers", ["cli", "mcp"]),
        ("A small HTTP service that greets people", ["cli", "http"]),
        ("a REST API for todo items", ["cli", "http"]),
    ],
)
def test_a_request_asks_for_the_kinds_its_words_name(request_text: str, asked: list[str]) -> None:
    assert asked_kinds(request_text) == asked


def test_a_kind_the_request_did_not_ask_for_is_refused_unless_the_tool_was_one() -> None:
    refused = unasked("http", "Render Markdown to HTML.")
    assert 'kind = "http" makes an HTTP service, which the request does not ask for' in refused
    assert 'set kind = "cli" (a command-line tool)' in refused
    assert unasked("http", "Render Markdown to HTML.", had="http") == ""  # the crate already was one
    assert unasked("http", "An HTTP service rendering Markdown") == ""
    assert unasked("cli", "An HTTP service rendering Markdown") == ""  # the default is always allowed


def test_the_edit_loop_refuses_a_contract_whose_kind_the_request_did_not_ask_for(tmp_path: Path) -> None:
    from functools import partial

    from flakebot_magic.edit.checkrun import workspace_contract

    manifest = tmp_path / "Cargo.toml"
    manifest.write_text('[package]\nname = "md"\n[package.metadata.flakebot]\nkind = "http"\nbin = "md"\n')
    contract, problem = workspace_contract(manifest, kind_rule=partial(unasked, request="Render Markdown to HTML."))
    assert contract is not None and "which the request does not ask for" in problem
    _, fine = workspace_contract(manifest, kind_rule=partial(unasked, request="An HTTP service for Markdown"))
    assert fine == ""


# -- a kind added as the docs say --------------------------------------------------------------------------------

_JSON_CALL = """
import json, sys
json.load(sys.stdin)
print(json.dumps(probe()))
"""


@pytest.fixture
def json_kind(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[ToolClient]]:
    """The test-only kind's row in the table (and its hostile program for the doors)."""
    rows = dict(KINDS)
    add_row(rows)
    for name, kind in rows.items():
        monkeypatch.setitem(KINDS, name, kind)
    monkeypatch.setitem(HOSTILE, JsonCallTool.kind, (_JSON_CALL, "hostile()"))
    tests = str(Path(__file__).resolve().parents[1])
    monkeypatch.setitem(
        CHILD_PRELUDE,
        JsonCallTool.kind,
        f"import sys\nsys.path.insert(0, {tests!r})\nfrom oneshot_kind import add_row\n"
        "from flakebot_magic.clients.kinds import KINDS\nadd_row(KINDS)\n",
    )
    yield JsonCallTool


def _oneshot(tmp_path: Path, **options: object) -> ToolClient:
    binary = tmp_path / "entry" / "bin" / "echo-json"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/usr/bin/python3\nimport json, sys\nprint(json.dumps(json.load(sys.stdin)))\n")
    binary.chmod(0o755)
    return make_tool(
        "echo_json",
        binary,
        crate="echo-json",
        version="0.1.0",
        source_hash="0" * 32,
        store_path=binary.parent.parent,
        contract={"kind": "json-call", "bin": "echo-json"},
        **options,  # type: ignore[arg-type]
    )


def test_the_new_kind_is_read_described_and_made_by_the_table(json_kind: type[ToolClient], tmp_path: Path) -> None:
    contract = read_contract({"package": {"metadata": {"flakebot": {"kind": "json-call", "bin": "x"}}}})
    assert contract.kind == "json-call"
    assert json_kind.contract_text in for_model() and '"json-call"' in for_model()
    assert asked_kinds("a JSON program that echoes") == ["cli", "json-call"]
    assert "which the request does not ask for" in unasked("json-call", "Render Markdown")
    tool = _oneshot(tmp_path, start=True)  # "start" starts nothing: it runs only when called
    assert type(tool) is json_kind and not tool.running and lifecycle.running() == []
    assert tool(a=1) == {"a": 1}
    assert "(JSON program)" in tool.usage()
    from flakebot_magic.clients.bridge import instructions

    assert "This server runs a JSON program built from" in instructions(tool)


def test_the_new_kind_is_never_started_or_stopped_like_a_server(json_kind: type[ToolClient], tmp_path: Path) -> None:
    from kindtools import register

    from flakebot_magic.manage import tools
    from flakebot_magic.pipeline.deployed import _after_install
    from flakebot_magic.server.dashboard import DashboardRow

    settings = Settings(cache_dir=tmp_path / "cache", registry=str(tmp_path))
    register(
        settings,
        "echo_json",
        "#!/usr/bin/python3\nimport json, sys\nprint(json.dumps(json.load(sys.stdin)))\n",
        "json-call",
    )
    built = _oneshot(tmp_path)
    assert _after_install(built, "echo_json", settings.cache.tools) == "" and built.on_state is None
    loaded = tools.load(settings, "echo_json")
    assert type(loaded) is json_kind and loaded.on_state is None and not loaded.running
    assert loaded(text="hi") == {"text": "hi"}
    assert tools.stop(settings, "echo_json") == (
        "echo_json is a JSON program: it runs only while called, so there is nothing to stop."
    )
    assert tools.stop_tools(settings).data == []  # stopping every running tool does not touch it
    assert "process output" not in tools.logs(settings, "echo_json")
    shown = tools.tool_json(loaded, settings)
    assert "proxy" not in shown["links"] and shown["status"] == "ready"
    assert not DashboardRow(tool=shown, log="", started="").stoppable
    assert not is_server("json-call") and kinds_module.a_noun("json-call") == "a JSON program"


@pytest.mark.skipif(bool(__import__("flakebot_magic.sandbox").sandbox.bubblewrap_works()), reason="no bubblewrap")
@pytest.mark.parametrize("door", [door for door in DOORS if applies(door, "cli") and door not in ("help", "build")])
def test_the_new_kind_is_confined_through_every_door(
    json_kind: type[ToolClient], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, door: str
) -> None:
    """The invariant test's doors, for the kind the table did not have: the same rule confines it."""
    with planted(tmp_path, monkeypatch) as host:
        said = DOORS[door](tmp_path, "json-call", host)
        assert isinstance(host, Host) and host.connections == [] and said.strip() == CONFINED, said
