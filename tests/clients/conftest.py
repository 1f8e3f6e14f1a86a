"""Fixtures for the client tests: the fixture crates (an MCP server, an HTTP service) built by the real pipeline."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from flakebot_magic.clients import lifecycle
from flakebot_magic.clients.base import ToolClient
from flakebot_magic.config import Settings
from flakebot_magic.pipeline import Pipeline
from flakebot_magic.testing.overlay import FIXTURES, overlay_registry


@pytest.fixture(scope="session")
def fixture_settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """Debian's registry plus tests/fixtures/*, and a cache (the run's shared one under `make test`)."""
    registry = overlay_registry(
        tmp_path_factory.mktemp("fixture-registry"), [FIXTURES / "demo-mcp", FIXTURES / "demo-http"]
    )
    cache = os.environ.get("FLAKEBOT_CACHE_DIR")
    return Settings(
        cache_dir=Path(cache) if cache else tmp_path_factory.mktemp("cache"), registry=str(registry), backend="cargo"
    )


@pytest.fixture
def build_tool(fixture_settings: Settings) -> Iterator[Callable[..., ToolClient]]:
    """``build_tool("demo-mcp", "calc")``: the fixture crate built (once per cache) and started; stopped at teardown."""
    made: list[ToolClient] = []

    def build(crate: str, name: str) -> ToolClient:
        tool = Pipeline(fixture_settings).run("", crate=crate, name=name)
        made.append(tool)
        return tool

    yield build
    for tool in made:
        tool.close()
        lifecycle.unregister(tool)  # type: ignore[arg-type]


@pytest.fixture
def calc(build_tool: Callable[..., ToolClient]) -> ToolClient:
    return build_tool("demo-mcp", "calc")


@pytest.fixture
def svc(build_tool: Callable[..., ToolClient]) -> ToolClient:
    return build_tool("demo-http", "svc")
