"""Fixtures of the edit loop's tests: tinyhex in a registry, and scripted sessions on it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from editscripts import TINYHEX
from tinycrates import write_registry
from tinyhex_sessions import Session, start_session

from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.testing.fake_openai import FakeOpenAIServer


@pytest.fixture(scope="module")
def hex_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DirectoryRegistry]:
    root = write_registry(tmp_path_factory.mktemp("hexregistry"), [TINYHEX])
    registry = DirectoryRegistry(root, tmp_path_factory.mktemp("hexindex"))
    yield registry
    registry.close()


@pytest.fixture
def session(
    hex_registry: DirectoryRegistry, tmp_path: Path, fake_openai: Callable[..., FakeOpenAIServer]
) -> Iterator[Callable[..., Session]]:
    """``session(script, **loop_options)``: tinyhex forked, a fake server replaying ``script``, a loop."""
    clients: list[Any] = []

    def start(
        script: Any,
        *,
        stream: bool = True,
        before: Callable[[Path], None] | None = None,
        timeout: float = 1.5,
        **options: Any,
    ) -> Session:
        options.setdefault("clippy", False)  # clippy runs in the sha2 sessions; here it only costs time
        return start_session(
            hex_registry,
            tmp_path,
            fake_openai,
            script,
            clients,
            timeout=timeout,
            stream=stream,
            before=before,
            **options,
        )

    yield start
    for client in clients:
        client.close()
