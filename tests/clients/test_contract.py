"""The tool contract in Cargo.toml, and the client stage choosing a client by it."""

from __future__ import annotations

from pathlib import Path

import pytest

from flakebot_magic.clients.cli import CliTool
from flakebot_magic.clients.contract import ToolContract, contract_of
from flakebot_magic.clients.http import HttpTool
from flakebot_magic.clients.mcp import McpTool
from flakebot_magic.errors import DeployError
from flakebot_magic.stages.client import Tool, make_tool


def _manifest(table: object = None, name: str = "demo") -> dict[str, object]:
    package: dict[str, object] = {"name": name, "version": "0.1.0"}
    if table is not None:
        package["metadata"] = {"flakebot": table}
    return {"package": package}


def test_a_crate_without_a_table_is_a_cli_tool() -> None:
    assert contract_of(_manifest(), ["demo", "helper"]) == ToolContract(kind="cli", bin="demo")
    assert contract_of(_manifest(), ["other"]).bin == "other"
    assert contract_of(_manifest(), ["a", "b"], main="b").bin == "b"


def test_the_table_names_kind_bin_health_and_deadline() -> None:
    contract = contract_of(_manifest({"kind": "http", "bin": "serve", "health": "/ready", "ready_timeout": 3}), ["demo", "serve"])
    assert contract == ToolContract(kind="http", bin="serve", health="/ready", ready_timeout=3.0)
    assert ToolContract.from_json(contract.to_json()) == contract
    assert ToolContract.from_json(None, default_bin="x") == ToolContract(kind="cli", bin="x")


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"kind": "grpc"}, "kind = 'grpc' in demo's Cargo.toml is not one of 'cli', 'mcp', 'http'"),
        ({"kind": "mcp", "bin": "nope"}, "bin = 'nope' in demo's Cargo.toml, but the crate builds demo"),
        ({"kind": "http", "health": "health"}, "must be a path starting with '/'"),
        ({"kind": "http", "ready_timeout": 0}, "must be a positive number of seconds"),
        ("mcp", "must be a table"),
    ],
)
def test_a_wrong_table_is_a_deploy_error(table: object, message: str) -> None:
    with pytest.raises(DeployError, match=message.replace("(", r"\(").replace(")", r"\)")):
        contract_of(_manifest(table), ["demo"])


@pytest.mark.parametrize(("kind", "cls"), [("cli", CliTool), ("mcp", McpTool), ("http", HttpTool)])
def test_make_tool_picks_the_client_by_kind(kind: str, cls: type, tmp_path: Path) -> None:
    tool = make_tool(
        "t", tmp_path / "bin" / "t", crate="t", version="1", source_hash="0", store_path=tmp_path,
        contract={"kind": kind, "bin": "t"}, start=False,
    )
    assert type(tool) is cls and tool.kind == kind and not tool.running
    assert Tool is CliTool
