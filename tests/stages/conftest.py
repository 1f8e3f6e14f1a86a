"""Fixtures for the stage tests: tiny crate registries, recorded events, forked workspaces."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tinycrates import Crate, Recorder, write_registry

from flakebot_magic.clients.cli_tool import CliTool as Tool
from flakebot_magic.config import Settings
from flakebot_magic.events import EventBus
from flakebot_magic.host.process import ProcessRunner
from flakebot_magic.pipeline import Pipeline
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.sandbox.cargo import Cargo
from flakebot_magic.stages.fork import Workspace, fork


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def runner() -> ProcessRunner:
    return ProcessRunner()


@pytest.fixture
def make_registry(tmp_path: Path) -> Iterator[Callable[..., DirectoryRegistry]]:
    """``make_registry("tinyecho", crate(...))``: a directory registry holding those crates.

    With no arguments it holds every crate in ``tinycrates.CRATES``. Each
    call gets its own registry directory and index cache under ``tmp_path``;
    ``embedding_model="off"`` ranks by words only (the lexical ranker's own tests).
    """
    made: list[DirectoryRegistry] = []

    def make(*crates: Crate | str, embedding_model: str | None = None) -> DirectoryRegistry:
        root = tmp_path / f"registry{len(made)}"
        write_registry(root, crates or None)
        registry = DirectoryRegistry(root, tmp_path / f"cache{len(made)}", embedding_model=embedding_model)
        made.append(registry)
        return registry

    yield make
    for registry in made:
        registry.close()


@pytest.fixture(scope="session")
def session_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DirectoryRegistry]:
    """Every tiny crate, written once per session (read-only: do not add crates to it)."""
    root = write_registry(tmp_path_factory.mktemp("registry"))
    registry = DirectoryRegistry(root, tmp_path_factory.mktemp("index"))
    yield registry
    registry.close()


@pytest.fixture(scope="session")
def forked(session_registry: DirectoryRegistry, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Workspace]:
    """``forked("tinyecho")``: that crate forked once per session (share it read-mostly)."""
    workspaces = tmp_path_factory.mktemp("workspaces")
    runner = ProcessRunner()
    done: dict[str, Workspace] = {}

    def get(name: str) -> Workspace:
        if name not in done:
            done[name] = fork(
                session_registry.get(name),
                session_registry,
                workspaces,
                name,
                runner=runner,
                bus=EventBus(),
                cargo=Cargo(session_registry, runner),
            )
        return done[name]

    return get


@pytest.fixture(scope="session")
def tinyecho_tool(session_registry: DirectoryRegistry, tmp_path_factory: pytest.TempPathFactory) -> Tool:
    """tinyecho built, tested and deployed by the real pipeline, once per session."""
    settings = Settings(cache_dir=tmp_path_factory.mktemp("cache"), registry=str(session_registry.path))
    return Pipeline(settings).run("", crate="tinyecho")
