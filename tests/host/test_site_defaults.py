"""Issue 37: a JupyterLab the user starts after `make demo` finds the nixpkgs the demo chose (no fallback)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from flakebot_magic.host import site_defaults
from flakebot_magic.options import option


def test_the_installed_default_comes_after_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "prefix", str(tmp_path))  # this Python's environment is tmp_path
    monkeypatch.delenv("FLAKEBOT_NIXPKGS", raising=False)
    assert option("nixpkgs").default_value() is None
    site_defaults.write({"FLAKEBOT_NIXPKGS": "path:/demo/nixpkgs"})
    assert (tmp_path / "etc" / "flakebot" / "defaults.json").is_file()
    assert option("nixpkgs").default_value() == "path:/demo/nixpkgs"  # what make demo chose
    monkeypatch.setenv("FLAKEBOT_NIXPKGS", "path:/mine")
    assert option("nixpkgs").default_value() == "path:/mine"  # the variable still wins
    site_defaults.write({"FLAKEBOT_NIXPKGS": ""})  # removed
    monkeypatch.delenv("FLAKEBOT_NIXPKGS")
    assert option("nixpkgs").default_value() is None


def test_a_damaged_file_is_no_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    monkeypatch.delenv("FLAKEBOT_NIXPKGS", raising=False)
    path = site_defaults.defaults_file()
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert option("nixpkgs").default_value() is None


def test_the_makefiles_demo_writes_it() -> None:
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    demo = makefile[makefile.index("\ndemo: install") :].split("\n\n")[0]
    assert "site_defaults" in demo and "FLAKEBOT_NIXPKGS" in demo
