"""The tool contract as a check run sees it: read by clients/contract.py (what deploy reads), in words for the model."""

from __future__ import annotations

import os
from pathlib import Path

from flakebot_magic.clients.kinds import KINDS
from flakebot_magic.edit.checkrun import workspace_contract

#: the table's kinds, as the contract reader names them
KNOWN = ", ".join(KINDS)

HEAD = '[package]\nname = "x"\nversion = "0.1.0"\n'


def test_workspace_contract(tmp_path: Path) -> None:
    manifest = tmp_path / "Cargo.toml"
    manifest.write_text('[package]\nname = "x"\n')
    assert "no [package.metadata.flakebot]" in workspace_contract(manifest)[1]
    manifest.write_text('[package]\nname = "x"\n[package.metadata.flakebot]\nkind = "gui"\nbin = "x"\n')
    assert f"kind must be one of {KNOWN}" in workspace_contract(manifest)[1]
    manifest.write_text('[package]\nname = "x"\n[package.metadata.flakebot]\nkind = "http"\n')
    assert "needs bin" in workspace_contract(manifest)[1]
    manifest.write_text('[package.metadata.flakebot]\nkind = "cli"\nbin = "sha256"\n\n[package]\nname = "x"\n')
    contract, problem = workspace_contract(manifest)
    assert problem == "" and contract is not None and (contract.kind, contract.bin) == ("cli", "sha256")


def test_a_contract_deploy_would_reject_is_a_problem_for_the_model(tmp_path: Path) -> None:
    manifest = tmp_path / "Cargo.toml"
    table = HEAD + '[package.metadata.flakebot]\nkind = "http"\nbin = "x"\n'
    manifest.write_text(table + 'health = "health"\n')
    assert "must be a plain path starting with '/'" in workspace_contract(manifest)[1]
    manifest.write_text(table + "ready_timeout = 0\n")
    assert "must be a positive number of seconds" in workspace_contract(manifest)[1]
    manifest.write_text(table)
    assert workspace_contract(manifest, ["x"], built=True)[1] == ""
    assert "the crate builds y" in workspace_contract(manifest, ["y"], built=True)[1]
    contract, problem = workspace_contract(manifest, [], built=True)
    assert contract is not None and "binaries built: none" in problem


def test_an_unreadable_manifest_is_a_problem_and_never_blocks(tmp_path: Path) -> None:
    manifest = tmp_path / "Cargo.toml"
    os.mkfifo(manifest)  # crate code could leave one; opening it must not wait for a writer
    assert "cannot be read" in workspace_contract(manifest)[1]
    manifest.unlink()
    manifest.symlink_to(tmp_path / "elsewhere.toml")
    (tmp_path / "elsewhere.toml").write_text(HEAD + '[package.metadata.flakebot]\nkind = "cli"\nbin = "x"\n')
    assert "cannot be read" in workspace_contract(manifest)[1]
    manifest.unlink()
    manifest.write_text(HEAD + "[[[")
    assert "not valid TOML" in workspace_contract(manifest)[1]
