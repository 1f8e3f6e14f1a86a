"""Whole-pipeline builds against the scripted fake OpenAI server (a test double): the registry, the settings, a kill.

Shared by the tests of candidates, the architect and sessions that survive::

    from scripted_builds import kill_when, scripted_settings, tiny_registry
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from editscripts import call, reply
from polling import wait_for
from tinycrates import Crate, write_registry

from flakebot_magic.config import Settings
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.testing.fake_openai import FakeOpenAIServer

__all__ = ["CHILD", "kill_when", "resumable_script", "scripted_settings", "tiny_registry"]

ROOT = Path(__file__).resolve().parents[1]

#: a build in a child process (argv: cache dir, registry, base URL, candidates), to be killed mid-run
CHILD = textwrap.dedent(
    """
    import sys
    from flakebot_magic.config import Settings
    from flakebot_magic.pipeline import Pipeline
    from flakebot_magic.request import BuildRequest, RunFlags
    cache, registry, base_url, candidates = sys.argv[1:5]
    request = sys.argv[5] if len(sys.argv) > 5 else "hex-encode standard input"
    settings = Settings(cache_dir=cache, registry=registry, backend="cargo", model="scripted-test-double",
                        base_url=base_url)
    flags = RunFlags(candidates=int(candidates))
    Pipeline(settings).run(BuildRequest(request, crate="tinyhex", name="hexer", flags=flags))
    """
)


def tiny_registry(factory: pytest.TempPathFactory, crates: Sequence[Crate]) -> Iterator[DirectoryRegistry]:
    """A directory registry of ``crates`` (for a module-scoped fixture: ``yield from tiny_registry(...)``)."""
    root = write_registry(factory.mktemp("registry"), list(crates))
    registry = DirectoryRegistry(root, factory.mktemp("index"))
    yield registry
    registry.close()


def scripted_settings(
    cache: Path, registry: DirectoryRegistry | Path, server: FakeOpenAIServer, **more: Any
) -> Settings:
    """Settings for a cargo build whose model is ``server`` (``registry``: one, or its directory)."""
    return Settings(
        cache_dir=cache,
        registry=str(registry.path if isinstance(registry, DirectoryRegistry) else registry),
        backend="cargo",
        model="scripted-test-double",
        base_url=server.base_url,
        **more,
    )


def resumable_script(tinyhex_main: str, contract: dict[str, Any]) -> list[dict[str, Any]]:
    """A session on tinyhex that a kill cuts while it waits for its second reply, and its reply after a resume."""
    first = reply(contract, call("write_file", path="src/main.rs", content=tinyhex_main), call("run_checks"))
    return [
        first,
        {**reply(call("finish", summary="never seen")), "delay": 120.0},  # the process dies waiting for this
        reply(call("finish", summary="finished after the resume")),
    ]


def kill_when(
    server: FakeOpenAIServer,
    cache: Path,
    registry: DirectoryRegistry,
    *,
    requests: int,
    candidates: int = 1,
    request: str | None = None,
) -> None:
    """Run :data:`CHILD` (on ``request``'s words, default tinyhex's), SIGKILL it once ``server`` has had ``requests``
    chat requests (its build never ends)."""
    words = [request] if request is not None else []
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(cache), str(registry.path), server.base_url, str(candidates), *words],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: len(server.requests) >= requests, timeout=240, what=f"{requests} requests of the build")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
