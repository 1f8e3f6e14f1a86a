"""The one factory: a deployed tool's client by its kind, from a store entry or a tool inventory record."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from flakebot_magic.clients import make_tool, tool_from_record
from flakebot_magic.clients.cli_tool import CliTool
from flakebot_magic.clients.http import HttpTool
from flakebot_magic.clients.mcp import McpTool
from flakebot_magic.errors import CacheFileDamaged, ToolError
from flakebot_magic.host.entry import binary_digest
from flakebot_magic.records.inventory import ToolRecord


@pytest.mark.parametrize(("kind", "cls"), [("cli", CliTool), ("mcp", McpTool), ("http", HttpTool)])
def test_make_tool_picks_the_client_by_kind(kind: str, cls: type, tmp_path: Path) -> None:
    tool = make_tool(
        "t",
        tmp_path / "bin" / "t",
        crate="t",
        version="1",
        source_hash="0",
        store_path=tmp_path,
        contract={"kind": kind, "bin": "t"},
        start=False,
    )
    assert type(tool) is cls and tool.kind == kind and not tool.running


def _whole(store: Path, **manifest: object) -> Path:
    """A whole store entry at ``store``: ``bin/t`` and a manifest with its digest (as deploy writes it)."""
    (store / "bin").mkdir(parents=True, exist_ok=True)
    (store / "bin" / "t").write_bytes(b"#!/bin/sh\necho t\n")
    (store / "bin" / "t").chmod(0o755)
    digests = {"t": binary_digest(store / "bin" / "t")}
    (store / "manifest.json").write_text(json.dumps({"binaries": ["t"], "digests": digests, **manifest}))
    return store


def _record(store: Path, kind: str = "cli", **fields: object) -> ToolRecord:
    options: dict[str, object] = dict(
        name="t",
        crate="t",
        version="1.0.0",
        binary=str(store / "bin" / "t"),
        store_path=str(store),
        source_hash="abc",
        checksum="sum",
        checksum_kind="sha256",
        registry="r",
        workspace="",
        commit="",
        kind=kind,
    )
    options.update(fields)
    return ToolRecord(**options)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kind", "cls"), [("cli", CliTool), ("mcp", McpTool), ("http", HttpTool)])
def test_a_record_gives_the_client_of_its_kind_not_started(kind: str, cls: type, tmp_path: Path) -> None:
    tool = tool_from_record(_record(_whole(tmp_path), kind), timeout=7.0, env={"A": "1"}, confine=True)
    assert type(tool) is cls and not tool.running
    assert (tool.name, tool.crate, tool.version, tool.source_hash, tool.checksum) == ("t", "t", "1.0.0", "abc", "sum")
    assert (tool.timeout, tool.env, tool.confine, tool.store_path) == (7.0, {"A": "1"}, True, tmp_path)


def test_the_stored_contract_says_the_kind_and_how_it_starts(tmp_path: Path) -> None:
    contract = {"kind": "http", "bin": "t", "health": "/ready", "ready_timeout": 3.0}
    _whole(tmp_path, contract=contract, description="a service")
    tool = tool_from_record(_record(tmp_path, "cli"))
    assert isinstance(tool, HttpTool)
    assert tool.contract.to_json() == contract and tool.description == "a service"
    # a manifest given by the caller wins over the file
    given = tool_from_record(_record(tmp_path, "cli"), provenance={"contract": {"kind": "mcp"}})
    assert isinstance(given, McpTool) and given.contract.bin == "t"


def test_a_nix_record_keeps_its_lock_hash(tmp_path: Path) -> None:
    tool = tool_from_record(_record(_whole(tmp_path), backend="nix", extra={"lock_hash": "sha256-x"}))
    assert (tool.backend, tool.lock_hash) == ("nix", "sha256-x")


def test_a_record_whose_entry_is_not_whole_makes_no_client(tmp_path: Path) -> None:
    record = _record(_whole(tmp_path))
    (tmp_path / "bin" / "t").write_bytes(b"#!/bin/sh\necho other tool\n")  # another binary in its place
    with pytest.raises(CacheFileDamaged, match=r"'t' cannot run: .*not the one deployed.*flakebot rebuild t"):
        tool_from_record(record)
    with pytest.raises(CacheFileDamaged, match="cannot be read"):
        tool_from_record(_record(tmp_path / "nowhere"))
    outside = _record(_whole(tmp_path), binary="/bin/sh")  # a record naming a binary outside its entry
    with pytest.raises(CacheFileDamaged, match="is not one its store entry"):
        tool_from_record(outside)


def test_a_nix_output_needs_its_binary_inside_it(tmp_path: Path) -> None:
    record = _record(Path("/nix/store/00000000000000000000000000000000-t-1.0.0"), backend="nix")
    with pytest.raises(CacheFileDamaged, match="is not a file in its nix store path"):
        tool_from_record(record)


@pytest.mark.parametrize("check", [True, False])
def test_a_client_checks_its_entry_again_before_each_run(tmp_path: Path, check: bool) -> None:
    """A client made while the entry was whole (a kernel's loaded tool, an agent catalog's), or made unchecked
    to describe a tool, refuses to run once the entry is not whole."""
    tool = tool_from_record(_record(_whole(tmp_path)), check=check)
    assert tool("x").strip() == "t"
    marker = tmp_path / "ran"
    (tmp_path / "bin" / "t").write_text(f"#!/bin/sh\ntouch {marker}\n")
    with pytest.raises(ToolError, match=r"t cannot run: .*not the one deployed.*Its binary was not run"):
        tool("x")
    assert not marker.exists()


def _same_size_and_mtime(binary: Path, marker: Path) -> None:
    """The binary rewritten in place to touch ``marker``, padded to its old size, its mtime set back."""
    stat = binary.stat()
    script = f"#!/bin/sh\ntouch {marker}\n#".encode()
    binary.write_bytes(script + b"#" * (stat.st_size - len(script)))
    os.utime(binary, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def _renamed_over(binary: Path, marker: Path) -> None:
    """Another file renamed over the binary (a new inode), mode and mtime as the old one's."""
    stat = binary.stat()
    fake = binary.with_name(".t.new")
    fake.write_text(f"#!/bin/sh\ntouch {marker}\n")
    fake.chmod(0o755)
    os.utime(fake, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.replace(fake, binary)


@pytest.mark.parametrize("tamper", [_same_size_and_mtime, _renamed_over])
def test_a_tampered_entry_is_refused_at_the_next_call_after_many_kept_verdicts(tmp_path: Path, tamper: Any) -> None:
    """The client door keeps the whole verdict between calls (an lstat of the manifest and the binary): a
    binary changed with its size and mtime kept, or swapped by a rename, is still refused at the next call."""
    tool = tool_from_record(_record(_whole(tmp_path)))
    for _ in range(5):
        assert tool("x").strip() == "t"
    marker = tmp_path / "ran"
    tamper(tmp_path / "bin" / "t", marker)
    for _ in range(2):
        with pytest.raises(ToolError, match=r"t cannot run: .*not the one deployed.*Its binary was not run"):
            tool("x")
    assert not marker.exists()


PACKAGE = Path(__file__).resolve().parents[2] / "flakebot_magic"
#: the modules that make a client from a binary without a record, and why that binary is whole
MAKERS_WITHOUT_RECORD = {
    # the factory itself: tool_from_record checks first (the test below), make_tool is its last step
    "clients/factory.py",
    # a build's `client` stage: the entry was just deployed or is a cache hit (stages.deploy.served: entry_damage)
    "pipeline/deployed.py",
    # a pull: the nix output was copied from a signed cache and checked against the proof's narHash
    "pipeline/team.py",
    # the judge runs a candidate's fresh build from a scratch copy: no store entry exists yet
    "edit/judge.py",
    # the MCP bridge serves the binary its parent names; the parent's client checked it (require_binary)
    "clients/bridge.py",
}


def _calls(name: str) -> dict[str, list[str]]:
    """Module -> the names of the functions in it that call ``name``."""
    import ast

    found: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for func in ast.walk(tree):
            if isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                for node in ast.walk(func):
                    if isinstance(node, ast.Call):
                        callee = node.func
                        called = callee.attr if isinstance(callee, ast.Attribute) else getattr(callee, "id", "")
                        if called == name:
                            found.setdefault(str(path.relative_to(PACKAGE)), []).append(func.name)
    return found


def test_every_client_from_a_record_is_checked_first() -> None:
    """Structure: a record becomes a client only through tool_from_record, which checks before it makes one."""
    import ast
    import inspect

    from flakebot_magic.clients import factory

    body = ast.parse(inspect.getsource(factory.tool_from_record)).body[0]
    assert isinstance(body, ast.FunctionDef)
    lines = {n.func.id: n.lineno for n in ast.walk(body) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert lines["check_runnable"] < lines["make_tool"]
    assert set(_calls("make_tool")) == MAKERS_WITHOUT_RECORD
    assert _calls("tool_from_record") == {"manage/tools.py": ["tool_of"]}
    assert _unchecked("tool_of") == UNCHECKED


#: the functions that make a client without the check (check=False), and why: they only describe the tool
UNCHECKED = {
    ("manage/tools.py", "describe"),  # `show NAME`: the provenance, for a damaged tool too
    ("manage/tools.py", "tool_json"),  # `list --json`, the REST API: the record and its provenance
    ("server/dashboard.py", "_entry"),  # the dashboard's link: the contract's health path
}


def _unchecked(name: str) -> set[tuple[str, str]]:
    """(module, function) of each call of ``name`` with ``check=False``."""
    import ast

    found = set()
    for path in PACKAGE.rglob("*.py"):
        for func in ast.walk(ast.parse(path.read_text())):
            if isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                for node in ast.walk(func):
                    if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == name:
                        check = [k.value for k in node.keywords if k.arg == "check"]
                        if check and not (isinstance(check[0], ast.Constant) and check[0].value is True):
                            found.add((str(path.relative_to(PACKAGE)), func.name))
    return found
