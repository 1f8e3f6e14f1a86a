"""Attacks by the model endpoint: a reply that never ends, in bytes or in time, is stopped and counts as unusable.

The fake OpenAI server's ``flood`` fault sends text forever (streamed or
as an endless JSON body). The loop must stop reading at its byte cap or its
time cap, say so, apply nothing from that reply, and carry on with the next.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from editscripts import TINYHEX, tinyhex_done
from tinycrates import write_registry
from tinyhex_sessions import start_session

from flakebot_magic.errors import ModelError
from flakebot_magic.events import Notice
from flakebot_magic.options import option
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.testing.fake_openai import FakeOpenAIServer

#: the reply caps every build gets unless set (the options table is their one place)
MAX_REPLY_BYTES = option("max_reply_bytes").default
MAX_REPLY_SECONDS = option("max_reply_seconds").default

pytestmark = pytest.mark.cargo


@pytest.fixture(scope="module")
def hex_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DirectoryRegistry]:
    registry = DirectoryRegistry(
        write_registry(tmp_path_factory.mktemp("registry"), [TINYHEX]), tmp_path_factory.mktemp("index")
    )
    yield registry
    registry.close()


@pytest.fixture
def run_loop(
    hex_registry: DirectoryRegistry, tmp_path: Path, fake_openai: Callable[..., FakeOpenAIServer]
) -> Iterator[Callable[..., tuple[Any, list[str], FakeOpenAIServer]]]:
    """``run_loop(script, stream=..., **loop_options)``: (outcome or the error, the unusable-reply notices, server)."""
    clients: list[Any] = []

    def start(script: Any, *, stream: bool = True, **options: Any) -> tuple[Any, list[str], FakeOpenAIServer]:
        session = start_session(
            hex_registry, tmp_path, fake_openai, script, clients, timeout=10.0, stream=stream, clippy=False, **options
        )
        loop, events, server = session.loop, session.events, session.server
        try:
            result: Any = loop.run("print standard input as hex")
        except ModelError as exc:
            result = exc
        notices = [e.message for e in events if isinstance(e, Notice) and "unusable" in e.message]
        return result, notices, server

    yield start
    for client in clients:
        client.close()


def test_the_defaults_are_sane() -> None:
    assert MAX_REPLY_BYTES == 4 * 1024 * 1024 and MAX_REPLY_SECONDS == 300.0


@pytest.mark.parametrize("stream", [True, False])
def test_an_endless_reply_is_stopped_at_the_byte_cap_and_the_next_reply_used(
    run_loop: Callable[..., tuple[Any, list[str], FakeOpenAIServer]], stream: bool
) -> None:
    started = time.monotonic()
    outcome, notices, _ = run_loop([{"fault": "flood"}, *tinyhex_done()], stream=stream)
    assert outcome.contract.bin == "tinyhex"  # the loop carried on with the next reply
    assert len(notices) == 1 and f"passed {MAX_REPLY_BYTES:,} bytes and was stopped" in notices[0]
    assert time.monotonic() - started < 60


def test_a_reply_that_drips_forever_is_stopped_at_the_time_cap(
    run_loop: Callable[..., tuple[Any, list[str], FakeOpenAIServer]],
) -> None:
    flood = {"fault": "flood", "chunk_bytes": 8, "interval": 0.1}
    started = time.monotonic()
    outcome, notices, _ = run_loop([flood, *tinyhex_done()], max_reply_seconds=1.0)
    assert outcome.contract.bin == "tinyhex"
    assert len(notices) == 1 and "took longer than 1 s and was stopped" in notices[0]
    assert time.monotonic() - started < 60


def test_an_endpoint_that_only_floods_is_a_clear_model_error(
    run_loop: Callable[..., tuple[Any, list[str], FakeOpenAIServer]],
) -> None:
    error, _, _ = run_loop([{"fault": "flood"}] * 4, max_reply_bytes=64 * 1024)
    assert isinstance(error, ModelError)
    assert "4 unusable replies in a row" in str(error) and "passed 65,536 bytes" in str(error)
    assert "Nothing from them was applied" in str(error)
