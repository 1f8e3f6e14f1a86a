"""Attacks on a deployed tool's environment: the kernel's secrets never reach a tool, of any kind.

A tool built on request prints its whole environment: as a command-line
tool (its calls and the automatic ``--help`` probe), as an MCP server and as
an HTTP service. The kernel holds canary secrets under the names that a
denylist lets through (``SECRET_KEY``, ``DATABASE_URL``, ``PGPASSWORD`` ...)
and the usual API keys; none may appear in anything the tool prints, returns
or logs. What the user passes explicitly (``env=``, the ``tool_env``
setting) does reach it.
"""

from __future__ import annotations

import json
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from flakebot_magic.clients import lifecycle
from flakebot_magic.clients.cli_tool import CliTool
from flakebot_magic.clients.contract import ToolContract
from flakebot_magic.clients.http import HttpTool
from flakebot_magic.clients.mcp import McpTool
from flakebot_magic.config import Settings
from flakebot_magic.options import parse_tool_env

CANARY_NAMES = (
    "OPENAI_API_KEY",
    "GROQ_API_KEY",
    "SECRET_KEY",
    "DATABASE_URL",
    "PGPASSWORD",
    "AZURE_OPENAI_KEY",
    "KAGGLE_KEY",
)


@pytest.fixture
def canaries(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Each secret name set in the kernel's environment to a random value that must appear nowhere."""
    values = {name: f"canary-{name.lower()}-{secrets.token_hex(12)}" for name in CANARY_NAMES}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


def _leaked(text: str, canaries: dict[str, str]) -> list[str]:
    return [name for name, value in canaries.items() if value in text]


def _script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


# -- a command-line tool ------------------------------------------------------------------

_ENV_CLI = """#!/bin/sh
if [ "$1" = --help ]; then
  echo "Usage: envdump [OPTIONS]"
  echo "Prints its environment."
  echo
  echo "Options:"
  echo "  -a, --all   every variable"
  env
  exit 0
fi
env
env >&2
"""


def test_a_cli_tool_and_its_help_probe_see_no_secret(tmp_path: Path, canaries: dict[str, str]) -> None:
    store = tmp_path / "store" / "envdump"
    binary = _script(store / "bin" / "envdump", _ENV_CLI)
    tool = CliTool(
        name="envdump",
        binary=binary,
        crate="envdump",
        version="0.1.0",
        source_hash="0" * 32,
        store_path=store,
        env={"FROM_SETTING": "setting-value"},
    )
    out = tool()
    assert "PATH=" in out  # the allowlist passes what a tool needs
    assert _leaked(out, canaries) == []
    # the --help probe runs on its own (the docstring, the signature); it sees no secret either
    assert tool.help.startswith("Usage: envdump")
    assert _leaked(tool.help, canaries) == []
    assert _leaked(tool.__doc__ or "", canaries) == [] and _leaked(repr(tool), canaries) == []
    # what the user passes on purpose does reach the tool: the setting, and env= per call
    assert "FROM_SETTING=setting-value" in out
    explicit = tool(env={"OPENAI_API_KEY": "given-on-purpose"})
    assert "OPENAI_API_KEY=given-on-purpose" in explicit
    assert _leaked(explicit, canaries) == []


def test_a_failing_cli_tools_error_carries_no_secret(tmp_path: Path, canaries: dict[str, str]) -> None:
    from flakebot_magic.errors import ToolError

    binary = _script(tmp_path / "bin" / "fails", "#!/bin/sh\nenv >&2\nexit 4\n")
    tool = CliTool(
        name="fails", binary=binary, crate="fails", version="1", source_hash="0", store_path=tmp_path, _help=""
    )
    with pytest.raises(ToolError) as caught:
        tool()
    assert _leaked(str(caught.value) + caught.value.stderr, canaries) == []


# -- an MCP server ------------------------------------------------------------------------

_ENV_MCP = """
import json, os, sys
sys.stderr.write(json.dumps(dict(os.environ)) + "\\n")
for line in sys.stdin:
    message = json.loads(line)
    if "id" not in message:
        continue
    method = message["method"]
    if method == "initialize":
        result = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                  "serverInfo": {"name": "envdump", "version": "0.1.0"}}
    elif method == "tools/list":
        result = {"tools": [{"name": "environ", "description": "The server's environment.",
                             "inputSchema": {"type": "object", "properties": {}}}]}
    elif method == "tools/call":
        result = {"content": [{"type": "text", "text": json.dumps(dict(os.environ))}]}
    else:
        reply = {"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32601, "message": method}}
        sys.stdout.write(json.dumps(reply) + "\\n"); sys.stdout.flush()
        continue
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}) + "\\n")
    sys.stdout.flush()
"""


@pytest.fixture
def mcp_envdump(tmp_path: Path) -> Iterator[McpTool]:
    binary = _script(tmp_path / "store" / "bin" / "envdump-mcp", f"#!{sys.executable}\n{_ENV_MCP}")
    tool = McpTool(
        name="envmcp",
        binary=binary,
        crate="envdump-mcp",
        version="0.1.0",
        source_hash="0" * 32,
        store_path=tmp_path / "store",
        contract=ToolContract(kind="mcp", bin="envdump-mcp"),
        env={"FROM_SETTING": "setting-value"},
    )
    yield tool
    tool.close()
    lifecycle.unregister(tool)


def test_an_mcp_server_sees_no_secret(mcp_envdump: McpTool, canaries: dict[str, str]) -> None:
    environ = json.loads(mcp_envdump.start().environ())
    assert "PATH" in environ and environ["FROM_SETTING"] == "setting-value"
    assert [name for name in CANARY_NAMES if name in environ] == []
    assert _leaked(json.dumps(environ), canaries) == []
    assert _leaked(mcp_envdump.logs(), canaries) == []  # what it printed to stderr at start


# -- an HTTP service ----------------------------------------------------------------------

_ENV_HTTP = """
import hmac, json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
sys.stderr.write(json.dumps(dict(os.environ)) + "\\n"); sys.stderr.flush()
print(json.dumps(dict(os.environ)), flush=True)
class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        expected = "Bearer " + os.environ["FLAKEBOT_TOKEN"]
        if self.path != "/health" and not hmac.compare_digest(self.headers.get("Authorization", ""), expected):
            status, body = 401, b"{}"
        else:
            status, body = 200, json.dumps(dict(os.environ)).encode()
        self.send_response(status); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
port = int(sys.argv[sys.argv.index("--port") + 1])
HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


@pytest.fixture
def http_envdump(tmp_path: Path) -> Iterator[HttpTool]:
    binary = _script(tmp_path / "store" / "bin" / "envdump-http", f"#!{sys.executable}\n{_ENV_HTTP}")
    tool = HttpTool(
        name="envhttp",
        binary=binary,
        crate="envdump-http",
        version="0.1.0",
        source_hash="0" * 32,
        store_path=tmp_path / "store",
        contract=ToolContract(kind="http", bin="envdump-http"),
        env={"FROM_SETTING": "setting-value"},
    )
    yield tool
    tool.close()
    lifecycle.unregister(tool)


def test_an_http_service_sees_no_secret(http_envdump: HttpTool, canaries: dict[str, str]) -> None:
    environ = http_envdump.get("/env").json()
    assert environ["FLAKEBOT_TOKEN"] and environ["PORT"] and environ["FROM_SETTING"] == "setting-value"
    assert [name for name in CANARY_NAMES if name in environ] == []
    assert _leaked(http_envdump.logs(), canaries) == []


# -- the setting --------------------------------------------------------------------------


def test_tool_env_names_variables_to_pass_on_purpose(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", "ghp-passed-on-purpose")
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    assert parse_tool_env("GITHUB_TOKEN, RUST_LOG=debug,NOT_SET_ANYWHERE,,") == {
        "GITHUB_TOKEN": "ghp-passed-on-purpose",
        "RUST_LOG": "debug",
    }
    monkeypatch.setenv("FLAKEBOT_TOOL_ENV", "RUST_LOG=info")
    assert Settings().tool_env == {"RUST_LOG": "info"}
    monkeypatch.delenv("FLAKEBOT_TOOL_ENV")
    assert Settings().tool_env == {}


# -- a real tool, built by the pipeline ---------------------------------------------------

_ENVDUMP_MAIN = r"""fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help") {
        println!("Usage: envdump [OPTIONS]\nPrints its environment.\n\nOptions:\n  -a, --all  every variable");
    }
    for (key, value) in std::env::vars() {
        println!("{}={}", key, value);
    }
}
"""


@pytest.mark.cargo
def test_a_built_cli_tool_sees_no_secret(tmp_path: Path, canaries: dict[str, str]) -> None:
    from tinycrates import Crate, write_registry

    from flakebot_magic.pipeline import Pipeline

    manifest = (
        '[package]\nname = "envdump"\nversion = "0.1.0"\nedition = "2021"\n'
        'description = "Print the environment"\nlicense = "MIT"\n'
    )
    registry = write_registry(
        tmp_path / "registry", [Crate("envdump", "0.1.0", manifest, {"src/main.rs": _ENVDUMP_MAIN})]
    )
    settings = Settings(
        cache_dir=tmp_path / "cache", registry=str(registry), backend="cargo", tool_env={"PASSED_ON_PURPOSE": "yes"}
    )
    tool = Pipeline(settings).run("", crate="envdump", name="envdump")
    assert isinstance(tool, CliTool)
    out = tool()
    assert "PATH=" in out and _leaked(out, canaries) == []
    assert "PASSED_ON_PURPOSE=yes" in out  # the tool_env setting reaches the tool
    assert tool.help.startswith("Usage: envdump") and _leaked(tool.help, canaries) == []
    # nothing the build or the tool wrote under the cache holds a canary either
    for path in settings.cache_dir.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.stat().st_size < 64 * 1024 * 1024:
            data = path.read_bytes()
            assert not [n for n, v in canaries.items() if v.encode() in data], path


def test_a_tools_kept_environment_follows_os_environ_and_its_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A client keeps the environment it made between calls; a change to os.environ, to its ``env`` setting or
    to the call's own variables makes the next call's afresh, and a caller changing the dict it got changes
    nothing kept."""
    from flakebot_magic.clients.cli_tool import PLAIN_ENV
    from flakebot_magic.host.environment import allowed_env

    tool = CliTool("t", tmp_path / "t", "t", "1", "0", tmp_path)
    monkeypatch.setenv("HOME", "/flakebot-probe-first")
    first = tool._environment(PLAIN_ENV)
    assert first == {**allowed_env(), "HOME": "/flakebot-probe-first", **PLAIN_ENV}
    first["INJECTED"] = "x"
    assert "INJECTED" not in tool._environment(PLAIN_ENV)
    monkeypatch.setenv("LC_FLAKEBOT_PROBE", "seen")
    assert tool._environment(PLAIN_ENV)["LC_FLAKEBOT_PROBE"] == "seen"
    monkeypatch.setenv("HOME", "/flakebot-probe-home")
    assert tool._environment(PLAIN_ENV)["HOME"] == "/flakebot-probe-home"
    tool.env["TOOL_SETTING"] = "1"
    assert tool._environment(PLAIN_ENV)["TOOL_SETTING"] == "1"
    assert tool._environment(PLAIN_ENV, {"CALL": "2"})["CALL"] == "2"
    assert "CALL" not in tool._environment(PLAIN_ENV)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-canary")
    assert "sk-canary" not in tool._environment(PLAIN_ENV).values()
