"""The tool contract in Cargo.toml: one reader, every key checked, messages that say what to write."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from flakebot_magic.clients.contract import ToolContract, read_contract
from flakebot_magic.clients.kinds import KINDS
from flakebot_magic.errors import DeployError

#: the table's kinds, as the contract reader names them
KNOWN = ", ".join(KINDS)


def _manifest(table: object = None, name: str = "demo") -> dict[str, object]:
    package: dict[str, object] = {"name": name, "version": "0.1.0"}
    if table is not None:
        package["metadata"] = {"flakebot": table}
    return {"package": package}


def test_a_crate_without_a_table_is_a_cli_tool() -> None:
    assert read_contract(_manifest(), ["demo", "helper"]) == ToolContract(kind="cli", bin="demo")
    assert read_contract(_manifest(), ["other"]).bin == "other"
    assert read_contract(_manifest(), ["a", "b"], main="b").bin == "b"


def test_the_table_names_kind_bin_health_and_deadline() -> None:
    contract = read_contract(
        _manifest({"kind": "http", "bin": "serve", "health": "/ready", "ready_timeout": 3}), ["demo", "serve"]
    )
    assert contract == ToolContract(kind="http", bin="serve", health="/ready", ready_timeout=3.0)
    assert ToolContract.from_json(contract.to_json()) == contract
    assert ToolContract.from_json(None, default_bin="x") == ToolContract(kind="cli", bin="x")


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"kind": "grpc"}, f"kind must be one of {KNOWN}, not 'grpc' in demo's Cargo.toml"),
        ({"kind": "mcp", "bin": "nope"}, "bin = 'nope' in demo's Cargo.toml, but the crate builds demo"),
        ({"kind": "mcp", "bin": 3}, "needs bin"),
        ({"kind": "http", "health": 7}, "must be a plain path starting with '/'"),
        ({"kind": "http", "ready_timeout": True}, "must be a positive number of seconds"),
        ({"kind": "http", "ready_timeout": "10"}, "must be a positive number of seconds"),
        ({"kind": "http", "health": "health"}, "must be a plain path starting with '/'"),
        ({"kind": "http", "ready_timeout": 0}, "must be a positive number of seconds"),
        ("mcp", "must be a table"),
    ],
)
def test_a_wrong_table_is_a_deploy_error(table: object, message: str) -> None:
    with pytest.raises(DeployError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_contract(_manifest(table), ["demo"])


@pytest.mark.parametrize(
    "health",
    [
        "/../../../logout",
        "/a/../../b",
        "/./x",
        "//evil.example/x",
        "/%2e%2e/x",
        "/x?y=1",
        "/x#y",
        "/a\\b",
        "/x y",
        "/é",
        "",
    ],
)
def test_a_health_path_a_browser_would_normalise_or_leave_by_is_refused(health: str) -> None:
    """The dashboard's "open" link is the proxy's prefix and this path: only plain parts, so it stays under it."""
    with pytest.raises(DeployError, match="must be a plain path"):
        read_contract(_manifest({"kind": "http", "health": health}), ["demo"])


@pytest.mark.parametrize("health", ["/", "/health", "/v1/ready/", "/.well-known/health", "/a-b_c~d.e"])
def test_a_plain_health_path_is_taken(health: str) -> None:
    assert read_contract(_manifest({"kind": "http", "health": health}), ["demo"]).health == health


def test_the_edit_loop_requires_the_table_kind_and_bin(tmp_path: Path) -> None:
    manifest = tmp_path / "Cargo.toml"
    manifest.write_text('[package]\nname = "x"\n')
    with pytest.raises(DeployError, match=r"no \[package.metadata.flakebot\] table"):
        read_contract(manifest, required=True)
    assert read_contract(manifest) == ToolContract(kind="cli", bin="x")
    manifest.write_text('[package]\nname = "x"\n[package.metadata.flakebot]\nkind = "http"\n')
    with pytest.raises(DeployError, match="needs bin"):
        read_contract(manifest, required=True)
    manifest.write_text('[package]\nname = "x"\n[package.metadata.flakebot]\nbin = "x"\n')
    with pytest.raises(DeployError, match=f"kind must be one of {KNOWN}, not None"):
        read_contract(manifest, required=True)
    manifest.write_text('[package.metadata.flakebot]\nkind = "cli"\nbin = "sha256"\n\n[package]\nname = "x"\n')
    contract = read_contract(manifest, required=True)
    assert (contract.kind, contract.bin, str(contract)) == ("cli", "sha256", 'kind = "cli", bin = "sha256"')


def test_a_manifest_that_is_not_toml_or_not_there_says_so(tmp_path: Path) -> None:
    with pytest.raises(DeployError, match="cannot be read"):
        read_contract(tmp_path / "missing" / "Cargo.toml")
    (tmp_path / "Cargo.toml").write_text("[package\n")
    with pytest.raises(DeployError, match="not valid TOML"):
        read_contract(tmp_path / "Cargo.toml")
    (tmp_path / "big.toml").write_bytes(b"#" * (2 << 20))
    with pytest.raises(DeployError, match="larger than"):
        read_contract(tmp_path / "big.toml")
    (tmp_path / "link.toml").symlink_to(tmp_path / "Cargo.toml")
    with pytest.raises(DeployError, match="cannot be read"):
        read_contract(tmp_path / "link.toml")


def test_a_fifo_named_cargo_toml_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    # crate code could leave one; opening it for reading must not block deploy until someone writes
    manifest = tmp_path / "Cargo.toml"
    os.mkfifo(manifest)
    result: list[Exception | ToolContract] = []

    def read() -> None:
        try:
            result.append(read_contract(manifest))
        except Exception as exc:  # handed to the test thread
            result.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=10)
    if reader.is_alive():  # unblock the reader so the test run can end, then fail
        with open(manifest, "wb"):
            pass
        reader.join(timeout=5)
        pytest.fail("read_contract blocked on a FIFO named Cargo.toml")
    assert len(result) == 1 and isinstance(result[0], DeployError), result
    assert "is not a regular file" in str(result[0]) and "FIFO" in str(result[0])


def test_a_symlinked_or_directory_manifest_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real.toml"
    real.write_text('[package]\nname = "x"\n')
    link = tmp_path / "Cargo.toml"
    link.symlink_to(real)
    with pytest.raises(DeployError, match="is a symlink"):
        read_contract(link)
    link.unlink()
    link.mkdir()
    with pytest.raises(DeployError, match="not a regular file"):
        read_contract(link)
