"""Fixtures for the backend tests: every tiny crate in a registry, and whether real nix can build here."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from tinycrates import write_registry

from flakebot_magic.backends.nix_command import NIX_FEATURES
from flakebot_magic.registry.directory import DirectoryRegistry

REPO = Path(__file__).resolve().parents[2]
#: the nixpkgs stand-in the nix tests build against (see tests/nixpkgs)
STAND_IN = REPO / "tests" / "nixpkgs"
NIX = shutil.which("nix")


@pytest.fixture(scope="session")
def session_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DirectoryRegistry]:
    """Every tiny crate, written once per session (read-only)."""
    root = write_registry(tmp_path_factory.mktemp("registry"))
    registry = DirectoryRegistry(root, tmp_path_factory.mktemp("index"))
    yield registry
    registry.close()


def nix_setup_problem() -> str | None:
    """Why real nix builds cannot run here, or None."""
    if NIX is None:
        return "nix is not installed (run scripts/setup-nix.sh as root)"
    done = subprocess.run([NIX, *NIX_FEATURES, "show-config"], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        return f"nix does not work here: {done.stderr[-300:]}"
    config = dict(line.partition(" = ")[::2] for line in done.stdout.splitlines())
    if config.get("sandbox", "") != "true":
        return "nix's sandbox is off; flakebot refuses to build in it (run scripts/setup-nix.sh)"
    if "/opt/host-rust=" not in config.get("sandbox-paths", "") and not Path("/usr/bin/cargo").exists():
        return "the stand-in finds no Rust toolchain in nix's sandbox (run scripts/setup-nix.sh)"
    return None


@pytest.fixture(scope="module")
def nix_ready() -> None:
    problem = nix_setup_problem()
    if problem:
        pytest.skip(problem)
