"""Pytest fixtures that start the package's test doubles (loaded as a pytest plugin)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .fake_openai import FakeOpenAIServer, Script

__all__ = ["fake_openai"]


@pytest.fixture
def fake_openai() -> Iterator[Callable[..., FakeOpenAIServer]]:
    """Start scripted OpenAI-compatible test doubles; stop them all at teardown.

    Examples
    --------
    >>> def test_reply(fake_openai):  # doctest: +SKIP
    ...     server = fake_openai([{"role": "assistant", "content": "hi"}])
    ...     client = openai.OpenAI(base_url=server.base_url, api_key="test")
    """
    servers: list[FakeOpenAIServer] = []

    def start(script: Script, **options: Any) -> FakeOpenAIServer:
        server = FakeOpenAIServer(script, **options)
        servers.append(server)
        server.start()
        return server

    yield start
    for server in reversed(servers):
        server.stop()
