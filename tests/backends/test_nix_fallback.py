"""``--backend auto`` falls back to cargo when nix cannot lock the flake's nixpkgs (say, offline)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from flakebot_magic.config import Settings
from flakebot_magic.errors import FlakeError
from flakebot_magic.events import Notice
from flakebot_magic.pipeline import Pipeline
from flakebot_magic.registry.directory import DirectoryRegistry

pytestmark = [
    pytest.mark.nix,
    pytest.mark.cargo,
    pytest.mark.skipif(shutil.which("nix") is None, reason="nix is not installed: run `make install`"),
]

# a nixpkgs input that fails to lock at once, without any network
UNREACHABLE = "path:/nonexistent/nixpkgs"


def test_auto_falls_back_to_cargo_and_says_so(session_registry: DirectoryRegistry, tmp_path: Path) -> None:
    events: list[object] = []
    settings = Settings(cache_dir=tmp_path, registry=str(session_registry.path), backend="auto", nixpkgs=UNREACHABLE)
    tool = Pipeline(settings, observers=[events.append]).run("", crate="tinyecho")
    assert tool.backend == "cargo"
    assert tool(input="hi") == "HI"
    notices = [e.message for e in events if isinstance(e, Notice)]
    # said once (issue 21: it was said twice per build), with what to do
    [said] = [n for n in notices if n.startswith("backend:") or "falling back" in n]
    assert "falling back to the cargo backend" in said and "--nixpkgs" in said

    # the warm re-run finds the cargo build at once, without asking nix again, and builds nothing: no notice
    again: list[object] = []
    Pipeline(settings, observers=[again.append]).run("", crate="tinyecho")
    assert not any(isinstance(e, Notice) and ("falling back" in e.message or "backend:" in e.message) for e in again)


def test_an_explicit_nix_backend_does_not_fall_back(session_registry: DirectoryRegistry, tmp_path: Path) -> None:
    settings = Settings(cache_dir=tmp_path, registry=str(session_registry.path), backend="nix", nixpkgs=UNREACHABLE)
    with pytest.raises(FlakeError) as failure:
        Pipeline(settings).run("", crate="tinyecho")
    assert failure.value.workspace is not None and failure.value.workspace.exists()
