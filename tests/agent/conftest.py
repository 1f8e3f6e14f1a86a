"""Fixtures for the agent front doors: a tiny registry, a private cache, the environment ``flakebot mcp`` runs in."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from tinycrates import write_registry

from flakebot_magic.config import Settings

#: the ``flakebot`` command of this interpreter
FLAKEBOT = Path(sys.executable).parent / "flakebot"


@pytest.fixture
def tiny_registry(tmp_path: Path) -> Path:
    return write_registry(tmp_path / "registry", ["tinyecho", "slowbuild"])


@pytest.fixture
def agent_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("FLAKEBOT_CACHE_DIR", str(cache))
    monkeypatch.setenv("FLAKEBOT_BACKEND", "cargo")
    return cache


@pytest.fixture
def agent_settings(agent_cache: Path, tiny_registry: Path) -> Settings:
    return Settings(cache_dir=agent_cache, registry=str(tiny_registry), backend="cargo")


@pytest.fixture
def mcp_env(agent_cache: Path) -> dict[str, str]:
    """The environment of a ``flakebot mcp`` child: this cache, the cargo backend."""
    return {**os.environ, "FLAKEBOT_CACHE_DIR": str(agent_cache), "FLAKEBOT_BACKEND": "cargo"}
