"""A crate's ``flake.lock`` chooses no nixpkgs: the nix backend evaluates only what the user's setting pins.

``nix flake lock`` keeps an existing lock whose ``original`` matches flake.nix's
input, whatever its ``locked`` says. A crate that ships a ``flake.lock`` (many
do), a model that writes one, or a test that plants one would choose the
nixpkgs whose Nix code ``nix build`` evaluates as the user and whose builders
make the tool that is deployed and pushed: before this rule, the lock below
(``original`` the user's nixpkgs, ``locked`` an attacker's copy) was kept, the
attacker's code was evaluated and its path recorded as the tool's nixpkgs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from tinycrates import Recorder, crate, write_registry

from flakebot_magic.backends.nix_command import NIX_FEATURES
from flakebot_magic.config import Settings
from flakebot_magic.events import LogLine
from flakebot_magic.pipeline import Pipeline

pytestmark = [
    pytest.mark.nix,
    pytest.mark.skipif(shutil.which("nix") is None, reason="nix is not installed (run scripts/setup-nix.sh as root)"),
]

REPO = Path(__file__).resolve().parents[2]
STAND_IN = REPO / "tests" / "nixpkgs"
MARKER = "ATTACKER-NIXPKGS-EVALUATED"


def _attacker_nixpkgs(tmp_path: Path) -> tuple[Path, dict[str, object]]:
    """A copy of the stand-in that announces itself when evaluated; its node as nix locks it."""
    evil = tmp_path / "evil-nixpkgs"
    shutil.copytree(STAND_IN, evil)
    flake = evil / "flake.nix"
    text = flake.read_text()
    assert "lib = import ./lib.nix;" in text
    flake.write_text(text.replace("lib = import ./lib.nix;", f'lib = builtins.trace "{MARKER}" (import ./lib.nix);'))
    done = subprocess.run(
        ["nix", *NIX_FEATURES, "flake", "metadata", "--json", f"path:{evil}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return evil, json.loads(done.stdout)["locked"]


def test_a_shipped_flake_lock_chooses_no_nixpkgs(tmp_path: Path) -> None:
    evil, locked_evil = _attacker_nixpkgs(tmp_path)
    lock = {
        "nodes": {
            "nixpkgs": {
                "locked": locked_evil,
                "original": {"path": str(STAND_IN), "type": "path"},
            },
            "root": {"inputs": {"nixpkgs": "nixpkgs"}},
        },
        "root": "root",
        "version": 7,
    }
    files = {
        "src/main.rs": 'fn main() {\n    println!("honest");\n}\n',
        "flake.lock": json.dumps(lock, indent=2) + "\n",
    }
    registry = write_registry(tmp_path / "registry", [crate("locked", files=files)])
    settings = Settings(cache_dir=tmp_path / "cache", registry=str(registry), backend="nix", nixpkgs=f"path:{STAND_IN}")
    recorder = Recorder()
    tool = Pipeline(settings, observers=[recorder]).run("", crate="locked")
    logged = "\n".join(e.line for e in recorder.of(LogLine))
    assert MARKER not in logged
    assert tool.provenance["nixpkgs"]["path"] == str(STAND_IN) != str(evil), tool.provenance["nixpkgs"]
    workspace = settings.cache.workspaces / "locked"
    locked = json.loads((workspace / "flake.lock").read_text())["nodes"]["nixpkgs"]["locked"]
    assert locked["path"] == str(STAND_IN)
    assert tool(input="") == "honest\n"
    # the lock nix made is flakebot's, kept in its private cache, not in the workspace the crate's code writes
    kept = [p for p in settings.cache.probes.iterdir() if p.name.startswith("nixpkgs-") and p.suffix == ".lock"]
    assert [json.loads(p.read_text())["nodes"]["nixpkgs"]["locked"]["path"] for p in kept] == [str(STAND_IN)]
