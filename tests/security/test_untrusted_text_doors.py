"""The invariant: nothing a crate, a build, a test or a tool writes reaches a terminal or a page as control.

One hostile payload (tests/hostile_text.py: every C0 and C1 control, each
escape-sequence family in 7- and 8-bit form, carriage-return and backspace
tricks, bidirectional overrides, HTML markup) is planted in every untrusted
source at once:

* a crate's description, in a directory registry and in the fake crates.io;
* a build script's stdout, stderr and ``cargo:warning``, with raw 8-bit bytes;
* a test's stdout, stderr and panic message;
* a README;
* a tool's ``--help``, its stdout and its stderr;
* an MCP server's descriptions, log, error reply and result; an HTTP
  service's OpenAPI summary, log, error answer and result.

Then every door that shows text is driven, as a person would: the
``flakebot`` command as a subprocess (``build``'s failure tail and error,
``--verbose``, ``logs``, ``search``, ``show``, ``list``, their ``--json``),
the magic in an ``InteractiveShell`` (line commands, a failing cell, ``tool?``,
the tool's display, a failing call), the progress widget's state (its HTML
and its plain text, with a diff that carries the payload), the clients' own
views (docstrings, ``usage()``, ``logs()``, error messages), and a real Jupyter
server's REST API and dashboard. At each: no forbidden character, no
unescaped markup, and the text around the payload is still there.

A tool's *return value* is data and is checked to stay byte for byte as the
tool wrote it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hostile_text import (
    PAYLOAD,
    RAW_8BIT,
    assert_shown_safely,
    marked,
    python_literal,
    rust_bytes,
    rust_string,
    toml_string,
)
from IPython.core.interactiveshell import InteractiveShell
from jupyter_process import JupyterProcess
from tinycrates import Crate, write_registry
from traitlets.config import Config

from flakebot_magic.clients import lifecycle
from flakebot_magic.clients.contract import ToolContract
from flakebot_magic.clients.http import HttpTool
from flakebot_magic.clients.mcp import McpTool
from flakebot_magic.config import Settings
from flakebot_magic.errors import ToolError
from flakebot_magic.manage import tools
from flakebot_magic.pipeline import Pipeline
from flakebot_magic.records.inventory import Inventory, ToolRecord
from flakebot_magic.records.provenance import workspace_diff
from flakebot_magic.testing.fake_cratesio import FakeCrate, FakeCratesIo
from flakebot_magic.views.widget import ProgressWidget

pytestmark = [pytest.mark.cargo, pytest.mark.kernel]

FLAKEBOT = Path(sys.executable).parent / "flakebot"
#: cargo hands a crate's description to rustc in an environment variable, which cannot hold NUL
DESCRIPTION = f"A hostile crate: {marked('DESC')}".replace("\x00", "")


def _manifest(name: str, extra: str = "") -> str:
    return (
        f'[package]\nname = "{name}"\nversion = "0.1.0"\nedition = "2021"\n'
        f'description = {toml_string(DESCRIPTION)}\nlicense = "MIT"\n{extra}'
    )


_RAW_LINE = rust_bytes(RAW_8BIT + b"\n")

#: a build script that writes the payload everywhere cargo reads, then fails
_BUILD_FAILS = f"""use std::io::Write;
fn main() {{
    println!("{{}}", {rust_string(marked("BUILDOUT"))});
    println!("cargo:warning={{}}", {rust_string(marked("BUILDWARN"))});
    eprintln!("{{}}", {rust_string(marked("BUILDERR"))});
    std::io::stdout().write_all({_RAW_LINE}).unwrap();
    std::io::stderr().write_all({_RAW_LINE}).unwrap();
    std::process::exit(1);
}}
"""

_TEST_FAILS = f"""fn main() {{
    println!("ok");
}}

#[cfg(test)]
mod tests {{
    use std::io::Write;
    #[test]
    fn prints_the_payload() {{
        println!("{{}}", {rust_string(marked("TESTOUT"))});
        eprintln!("{{}}", {rust_string(marked("TESTERR"))});
        std::io::stdout().write_all({_RAW_LINE}).unwrap();
        panic!("{{}}", {rust_string(marked("PANIC"))});
    }}
}}
"""

_HELP = f"Usage: hosttool [OPTIONS]\n\n{marked('HELP')}\nReads standard input.\n\nOptions:\n      --fail    exit 2\n  -h, --help    Print help\n"
_TOOL = f"""use std::io::{{Read, Write}};
const HELP: &str = {rust_string(_HELP)};
fn main() {{
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {{
        Some("--help") | Some("-h") => print!("{{}}", HELP),
        Some("--fail") => {{
            eprintln!("{{}}", {rust_string(marked("TOOLERR"))});
            std::io::stderr().write_all({rust_bytes(RAW_8BIT)}).unwrap();
            std::process::exit(2);
        }}
        _ => {{
            let mut input = String::new();
            std::io::stdin().read_to_string(&mut input).unwrap();
            print!("{{}}{{}}", {rust_string(marked("RESULT"))}, input);
        }}
    }}
}}
"""
_TOOL_BUILD = f'fn main() {{\n    println!("cargo:warning={{}}", {rust_string(marked("TOOLWARN"))});\n}}\n'

CRATES = [
    Crate("hostbuild", "0.1.0", _manifest("hostbuild"), {"src/main.rs": "fn main() {}\n", "build.rs": _BUILD_FAILS}),
    Crate("hosttest", "0.1.0", _manifest("hosttest"), {"src/main.rs": _TEST_FAILS}),
    Crate(
        "hosttool",
        "0.1.0",
        _manifest("hosttool"),
        {"src/main.rs": _TOOL, "build.rs": _TOOL_BUILD, "README.md": f"# hosttool\n\n{marked('README')}\n"},
    ),
]

# -- the MCP server and the HTTP service: Python scripts stand in for their binaries -------------

_MCP = f"""import json, sys
def kept(source):
    return {python_literal(marked("@"))}.replace("@", source)
sys.stderr.write(kept("MCPLOG") + "\\n"); sys.stderr.flush()
sys.stderr.buffer.write({RAW_8BIT!r} + b"\\n"); sys.stderr.flush()
for line in sys.stdin:
    message = json.loads(line)
    if "id" not in message:
        continue
    method = message["method"]
    if method == "initialize":
        result = {{"protocolVersion": "2025-06-18", "capabilities": {{"tools": {{}}}},
                  "serverInfo": {{"name": kept("MCPNAME"), "version": "1"}}, "instructions": kept("MCPINSTR")}}
    elif method == "tools/list":
        schema = {{"type": "object", "properties": {{"text": {{"type": "string", "description": kept("MCPPARAM")}}}}}}
        result = {{"tools": [{{"name": "echo", "description": kept("MCPDESC"), "inputSchema": schema}},
                            {{"name": "fail", "description": "fails", "inputSchema": {{"type": "object"}}}}]}}
    elif method == "tools/call":
        sys.stderr.write(kept("MCPCALLLOG") + "\\n"); sys.stderr.flush()
        if message["params"]["name"] == "fail":
            result = {{"isError": True, "content": [{{"type": "text", "text": kept("MCPERR")}}]}}
        else:
            result = {{"content": [{{"type": "text", "text": kept("MCPRESULT")}}]}}
    else:
        result = {{}}
    sys.stdout.write(json.dumps({{"jsonrpc": "2.0", "id": message["id"], "result": result}}) + "\\n")
    sys.stdout.flush()
"""

_HTTP = f"""import hmac, json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
def kept(source):
    return {python_literal(marked("@"))}.replace("@", source)
OPENAPI = {{"openapi": "3.0.0", "info": {{"title": "hostile", "version": "1"}}, "paths": {{
    "/echo": {{"get": {{"operationId": "echo", "summary": kept("HTTPDESC"),
              "parameters": [{{"name": "text", "in": "query", "description": kept("HTTPPARAM"),
                              "schema": {{"type": "string"}}}}]}}}},
    "/fail": {{"get": {{"operationId": "fail", "summary": "fails"}}}}}}}}
class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        path = self.path.split("?")[0]
        if path != "/health" and not hmac.compare_digest(
                self.headers.get("Authorization", ""), "Bearer " + os.environ["FLAKEBOT_TOKEN"]):
            self.send_response(401); self.send_header("Content-Length", "0"); self.end_headers(); return
        sys.stdout.write(kept("HTTPOUT") + "\\n"); sys.stdout.flush()
        sys.stderr.write(kept("HTTPLOG") + "\\n"); sys.stderr.flush()
        status, kind, body = 200, "text/plain; charset=utf-8", b"ok"
        if path == "/openapi.json":
            kind, body = "application/json", json.dumps(OPENAPI).encode()
        elif path == "/echo":
            body = kept("HTTPRESULT").encode()
        elif path == "/fail":
            status, body = 500, kept("HTTPERR").encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
port = int(sys.argv[sys.argv.index("--port") + 1])
HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


@dataclass
class World:
    """Where the payload was planted, and what each door of the command showed."""

    registry: Path
    cache: Path
    cratesio: str
    env: dict[str, str]
    shown: dict[str, tuple[str, str]] = field(default_factory=dict)
    codes: dict[str, int] = field(default_factory=dict)

    @property
    def settings(self) -> Settings:
        return Settings(cache_dir=self.cache, registry=str(self.registry), backend="cargo")


#: the command's doors: (id, arguments, the markers the door must still show)
CLI_DOORS: list[tuple[str, list[str], tuple[str, ...]]] = [
    ("search", ["search", "hostile crate"], ("DESC-KEPT",)),
    ("search --json", ["search", "hostile crate", "--json"], ("DESC-KEPT", "DESC-END")),
    ("search crates.io", ["search", "hostile", "--registry", "{cratesio}"], ("CRATESIO-KEPT",)),
    ("search crates.io --json", ["search", "hostile", "--registry", "{cratesio}", "--json"], ("CRATESIO-END",)),
    # cargo 1.95 shows a failed build script's `cargo:warning`s, not its stdout and stderr
    ("build: a build script fails", ["build", "--crate", "hostbuild", "--name", "hb"], ("BUILDWARN-KEPT",)),
    (
        "build --verbose: a build script fails",
        ["build", "--crate", "hostbuild", "--name", "hb", "--verbose"],
        ("BUILDWARN-KEPT", "BUILDWARN-END"),
    ),
    ("logs: a failed build script", ["logs", "hb"], ("BUILDWARN-KEPT", "BUILDWARN-END")),
    ("logs --json: a failed build script", ["logs", "hb", "--json"], ("BUILDWARN-END",)),
    ("build: a test fails", ["build", "--crate", "hosttest", "--name", "ht"], ("PANIC-KEPT", "PANIC-END")),
    ("logs: a failed test", ["logs", "ht"], ("TESTOUT-KEPT", "TESTERR-END", "PANIC-END")),
    ("build --json: a test fails", ["build", "--crate", "hosttest", "--name", "ht", "--json"], ("PANIC-KEPT",)),
    ("build: the tool", ["build", "--crate", "hosttool", "--name", "tool"], ("HELP-KEPT", "DESC-KEPT")),
    ("logs: the tool", ["logs", "tool"], ("TOOLWARN-KEPT", "TOOLWARN-END")),
    ("build --json: the tool", ["build", "--crate", "hosttool", "--name", "tool", "--json"], ("DESC-END",)),
    ("show", ["show", "tool"], ("hosttool",)),
    ("show --json", ["show", "tool", "--json"], ("DESC-END",)),
    ("list", ["list"], ("hosttool@0.1.0",)),
    ("list --json", ["list", "--json"], ("DESC-END",)),
]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("hostile")
    registry = write_registry(root / "registry", CRATES)
    cache = root / "cache"
    env = {**os.environ, "FLAKEBOT_CACHE_DIR": str(cache), "FLAKEBOT_REGISTRY": str(registry)}
    env["FLAKEBOT_BACKEND"] = "cargo"
    fake = FakeCrate("hostilecrate", "1.0.0", description=f"A hostile crate: {marked('CRATESIO')}", bin_names=("x",))
    with FakeCratesIo([fake]) as cratesio:
        made = World(registry, cache, cratesio.url, env)
        for door, argv, _ in CLI_DOORS:
            args = [a.replace("{cratesio}", cratesio.url) for a in argv]
            done = subprocess.run(
                [str(FLAKEBOT), *args], env=env, capture_output=True, timeout=600, cwd=root, check=False
            )
            # what a terminal would get (bytes that are not UTF-8 are kept apart, as surrogates)
            made.shown[door] = (
                done.stdout.decode("utf-8", "surrogateescape"),
                done.stderr.decode("utf-8", "surrogateescape"),
            )
            made.codes[door] = done.returncode
        yield made


@pytest.mark.parametrize(
    ("door", "kept"), [(door, kept) for door, _, kept in CLI_DOORS], ids=[d for d, _, _ in CLI_DOORS]
)
def test_the_command_shows_no_control_characters(world: World, door: str, kept: tuple[str, ...]) -> None:
    stdout, stderr = world.shown[door]
    shown = stdout + stderr
    assert not any(0xDC80 <= ord(c) <= 0xDCFF for c in shown), f"{door}: bytes that are not UTF-8 reached the terminal"
    assert_shown_safely(shown, f"flakebot {door}", kept=kept)
    expected = 1 if door.startswith("build") and "the tool" not in door else 0
    assert world.codes[door] == expected, shown[-2000:]
    if "--json" in door:  # still JSON on stdout: the data is there, made safe string by string
        json.loads(stdout)


# -- the magic -----------------------------------------------------------------------------------


@pytest.fixture
def ip(world: World) -> Iterator[InteractiveShell]:
    config = Config()
    config.HistoryManager.enabled = False
    config.FlakebotMagics.cache_dir = str(world.cache)
    config.FlakebotMagics.registry = str(world.registry)
    config.FlakebotMagics.backend = "cargo"
    config.InteractiveShell.colors = "nocolor"  # IPython's own colours would be escape sequences too
    shell = InteractiveShell(config=config)
    shell.extension_manager.load_extension("flakebot_magic")
    yield shell
    shell.cleanup()


def test_the_magic_shows_no_control_characters(
    world: World, ip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    cells = [
        ("search", "%flakebot search hostile crate", ("DESC-KEPT",)),
        ("logs", "%flakebot logs hb", ("BUILDWARN-KEPT",)),
        ("show", "%flakebot show tool", ("hosttool",)),
        ("list", "%flakebot list", ("hosttool",)),
        ("load", "%flakebot load tool", ("tool",)),
        ("the tool's help", "tool?", ("HELP-KEPT", "HELP-END")),
        ("the tool's display", "tool", ("DESC-KEPT",)),
        ("the tool's usage", "print(tool.usage())", ("HELP-END",)),
        ("a failing call", "tool('--fail')", ("TOOLERR-KEPT", "TOOLERR-END")),
        ("a failing cell", "%%flakebot --crate hosttest --name ht\nrun the hostile tests\n", ("PANIC-KEPT",)),
    ]
    for what, cell, kept in cells:
        ip.run_cell(cell)
        out, err = capsys.readouterr()
        assert_shown_safely(out + err, f"the magic: {what}", kept=kept)
    tool = ip.user_ns["tool"]
    assert_shown_safely(tool._repr_html_(), "the tool's HTML", kept=("DESC-KEPT",), html=True)
    # the result is data: as the tool wrote it (escape sequences and all, with raw=True)
    assert tool("in", raw=True) == marked("RESULT") + "in"


# -- the widget ----------------------------------------------------------------------------------


def _widget_views(widget: ProgressWidget) -> dict[str, str]:
    parts = {
        "title": widget.title.value,
        "counts": widget.counts.value,
        "table": widget.table.value,
        "notices": widget.notice_view.value,
        "summary": widget.summary.value,
        "log": widget.log_view.value,
        # what the cell keeps when the build ends: the record, HTML a page renders without a kernel
        "record": widget.record().html(),
    }
    for index, fold in enumerate(widget.diff_box.children):
        parts[f"diff {index}"] = fold.value
        parts[f"diff title {index}"] = widget.diff_box.get_title(index) or ""
    return parts


def test_the_widget_shows_no_control_characters(world: World, tmp_path: Path) -> None:
    failing = ProgressWidget("a hostile test", show_error=True)
    with pytest.raises(Exception, match="cargo test"):
        Pipeline(world.settings, observers=[failing]).run("", crate="hosttest", name="ht")
    views = _widget_views(failing)
    for name, value in views.items():
        assert_shown_safely(value, f"the widget ({name}), a failed test", html=True)
    for marker in ("TESTOUT-KEPT", "TESTERR-END", "PANIC-KEPT", "PANIC-END"):
        assert marker in views["log"]
    assert "cargo test: 1 failed" in views["summary"]
    assert_shown_safely(failing.text(), "the widget's text", kept=("cargo test",))
    assert_shown_safely(failing.record().text(), "the record's text", kept=("cargo test",))

    # a diff that carries the payload (a model could write it): the review shows it, made safe
    workspace = tmp_path / "workspace"
    shutil.copytree(world.settings.cache.workspaces / "tool", workspace, symlinks=True)
    # (without NUL: git would call the file binary and show none of it)
    (workspace / "src" / "payload.rs").write_text(f"// {marked('DIFF')}\n".replace("\x00", ""))
    git = ["git", "-C", str(workspace), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "core.hooksPath=/dev/null"]
    subprocess.run([*git, "add", "-A"], check=True, capture_output=True)
    subprocess.run([*git, "commit", "-qm", "what a model wrote"], check=True, capture_output=True)
    done = ProgressWidget("a hostile tool", diff=lambda _tool: workspace_diff(workspace), show_error=True)
    tool = Pipeline(world.settings, observers=[done]).run("", crate="hosttool", name="tool")
    for name, value in _widget_views(done).items():
        assert_shown_safely(value, f"the widget ({name}), a tool", html=True)
    views = _widget_views(done)
    assert "DIFF-KEPT" in views["diff 0"] and "DIFF-END" in views["diff 0"]
    assert "DIFF-KEPT" in views["record"]
    assert_shown_safely(done.text(), "the widget's text, a tool", kept=("tool",))
    assert_shown_safely(done.mimebundle()["text/plain"], "the widget's text/plain")
    assert_shown_safely(tool.__doc__, "the tool's docstring", kept=("HELP-KEPT", "HELP-END"))


# -- MCP and HTTP tools -----------------------------------------------------------------------------


def _script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(0o755)
    return path


def _scripted(kind: type[Any], name: str, body: str, tmp_path: Path, **extra: Any) -> Any:
    """A client of ``kind`` whose binary is the Python script ``body``."""
    store = tmp_path / name
    return kind(
        name=name,
        binary=_script(store / name, body),
        crate=name,
        version="1",
        source_hash="0",
        store_path=store,
        contract=ToolContract(kind=kind.kind, bin=name),
        **extra,
    )


def test_mcp_and_http_tools_show_no_control_characters(world: World, tmp_path: Path) -> None:
    settings = world.settings
    # registered in this cache (its home), as tools made from its inventory are: `flakebot logs` finds them there
    home = settings.cache.root
    mcp = _scripted(McpTool, "hostmcp", _MCP, tmp_path, provenance={"description": marked("MCPPROV")}, home=home)
    http = _scripted(HttpTool, "hosthttp", _HTTP, tmp_path, home=home)
    inventory = Inventory(settings.cache.tools)
    for tool in (mcp, http):
        inventory.save(
            ToolRecord(
                name=tool.name, crate=tool.crate, version="1", binary=str(tool.binary), store_path=str(tool.store_path),
                source_hash="0", checksum="", checksum_kind="", registry="", workspace="", commit="", kind=tool.kind,
            )
        )  # fmt: skip
    try:
        mcp.start()
        http.start()
        # results are data, byte for byte
        assert mcp.echo(text="x") == marked("MCPRESULT")
        assert http.echo(text="x") == marked("HTTPRESULT")
        shown = {
            "MCP docstring": (mcp.echo.__doc__, ("MCPDESC-KEPT", "MCPPARAM-END")),
            "MCP usage": (mcp.usage(), ("MCPDESC-KEPT", "MCPPROV-KEPT")),
            "MCP repr": (repr(mcp), ("echo",)),
            "MCP logs": (mcp.logs(), ("MCPLOG-KEPT", "MCPCALLLOG-END")),
            "HTTP docstring": (http.echo.__doc__, ("HTTPDESC-KEPT", "HTTPPARAM-END")),
            "HTTP usage": (http.usage(), ("HTTPDESC-END",)),
            "HTTP logs": (http.logs(), ("HTTPLOG-KEPT", "HTTPOUT-END")),
            "flakebot logs, MCP": (tools.logs(settings, "hostmcp"), ("MCPLOG-END",)),
            "flakebot logs, HTTP": (tools.logs(settings, "hosthttp"), ("HTTPLOG-END",)),
        }
        with pytest.raises(ToolError) as mcp_error:
            mcp.fail()
        with pytest.raises(ToolError) as http_error:
            http.fail()
        shown["MCP error"] = (str(mcp_error.value), ("MCPERR-KEPT", "MCPERR-END"))
        shown["HTTP error"] = (str(http_error.value), ("HTTPERR-KEPT",))
        for where, (text, kept) in shown.items():
            assert_shown_safely(str(text), where, kept=kept)
        for tool in (mcp, http):
            assert_shown_safely(tool._repr_html_(), f"{tool.kind} HTML", html=True)
        assert "MCPERR-KEPT" in mcp_error.value.stderr and "\x1b" in mcp_error.value.stderr  # the attribute is data
    finally:
        for tool in (mcp, http):
            tool.close()
            lifecycle.unregister(tool)
            inventory.remove(tool.name)


# -- the Jupyter server ------------------------------------------------------------------------------


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def test_the_api_and_the_dashboard_show_no_control_characters(world: World, tmp_path: Path) -> None:
    jupyter = JupyterProcess(tmp_path / "root", env={"FLAKEBOT_CACHE_DIR": str(world.cache)})
    (tmp_path / "root").mkdir()
    jupyter.start()
    try:
        with jupyter.client() as client:
            pages = {
                "tools": client.get("/flakebot/api/tools"),
                "tool": client.get("/flakebot/api/tools/tool"),
                "logs of a failed build script": client.get("/flakebot/api/tools/hb/logs"),
                "logs of a failed test": client.get("/flakebot/api/tools/ht/logs"),
                "logs of the tool": client.get("/flakebot/api/tools/tool/logs"),
            }
            dashboard = client.get("/flakebot/")
    finally:
        jupyter.stop()
    kept = {
        "tools": ("DESC-END",),
        "tool": ("DESC-KEPT",),
        "logs of a failed build script": ("BUILDWARN-KEPT",),
        "logs of a failed test": ("PANIC-END",),
        "logs of the tool": ("hosttool",),
    }
    for where, answer in pages.items():
        assert answer.status_code == 200, where
        assert_shown_safely(answer.text, f"API {where} (body)")
        assert_shown_safely("\n".join(_strings(answer.json())), f"API {where} (decoded)", kept=kept[where])
    assert dashboard.status_code == 200
    assert_shown_safely(dashboard.text, "the dashboard", kept=("DESC-KEPT", "DESC-END"), html=True)


def test_the_payload_is_what_the_sources_hold() -> None:
    """The fixture plants what it says: the payload really holds each family (a guard on the guard)."""
    for needle in ("\x1b]52;", "\x1b]8;;", "\x1b]0;", "\x1b[2J", "\x1bP", "\x1bX", "\x1b^", "\x1b_", "\x9b", "\x9d"):
        assert needle in PAYLOAD
    assert all(chr(c) in PAYLOAD for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)] if chr(c) not in "\t\n")
    assert "\u202e" in PAYLOAD and "\u2066" in PAYLOAD and "\r" in PAYLOAD and "\x08" in PAYLOAD


@pytest.mark.parametrize(
    "door", ["build: a test fails", "build: a build script fails", "logs: a failed test", "search", "search crates.io"]
)
def test_the_reported_attacks_fail_and_the_text_stays(world: World, door: str) -> None:
    """Issue 19's findings: OSC 52 wrote the clipboard, OSC 8 made links, the title changed, the screen cleared."""
    shown = "".join(world.shown[door])
    assert "ZXZpbCBjbGlwYm9hcmQ=" not in shown  # the clipboard write went, payload and all
    assert "evil.example" not in shown  # the link's target went; its text stays where a test printed it
    assert "pwned title" not in shown and "eight-bit title" not in shown  # no title change, 7- or 8-bit
    assert "\x1b" not in shown and "\x9b" not in shown and "\r" not in shown  # no clear screen, no overwrite
    if "test" in door:  # (cargo mangles a build script's warning itself; a test's output reaches flakebot whole)
        for text in ("click me", "safe text\nEVIL OVERWRITE", "abc\ufffd\ufffd\ufffdXYZ", "\ufffdevil\ufffd"):
            assert text in shown
