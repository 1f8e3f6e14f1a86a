"""Fixtures for the agent front doors: a tiny registry, a private cache, the environment ``flakebot mcp`` runs in."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from raw_client import FLAKEBOT, Client
from tinycrates import write_registry

from flakebot_magic.config import Settings

__all__ = ["FLAKEBOT"]  # the ``flakebot`` command of this interpreter (raw_client.py says it)


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


@pytest.fixture
def client(tiny_registry: Path, mcp_env: dict[str, str]) -> Iterator[Callable[..., Client]]:
    """``client(*argv)``: a raw client of a new ``flakebot mcp --registry REGISTRY *argv`` (stopped after the test)."""
    made: list[Client] = []

    def start(*argv: str) -> Client:
        made.append(Client(["--registry", str(tiny_registry), *argv], mcp_env))
        return made[-1]

    yield start
    for each in made:
        if each.proc.poll() is None:
            each.proc.kill()
            each.proc.wait()
        for stream in (each.proc.stdin, each.proc.stdout):
            if stream is not None and not stream.closed:
                stream.close()
