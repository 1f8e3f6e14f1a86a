"""Scripted edit sessions on the tiny ``tinyhex`` crate: real cargo in the sandbox, real git, the fake OpenAI server.

Shared by the edit loop's tests and the security tests that attack it::

    from tinyhex_sessions import Session, start_session
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from flakebot_magic.config import Settings
from flakebot_magic.edit import EditLoop
from flakebot_magic.edit.session import engineer_channel
from flakebot_magic.events import EventBus, IterationResult
from flakebot_magic.host.git import Git
from flakebot_magic.host.process import ProcessRunner
from flakebot_magic.llm.budget import Budget
from flakebot_magic.llm.model import ModelConfig
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.sandbox import Sandbox
from flakebot_magic.sandbox.cargo import Cargo
from flakebot_magic.stages.fork import fork
from flakebot_magic.testing.fake_openai import FakeOpenAIServer

__all__ = ["Session", "start_session"]

#: the settings a session's options may set (the rest are the loop's own keywords)
SETTINGS = {f.name for f in fields(Settings)}


@dataclass
class Session:
    loop: EditLoop
    server: FakeOpenAIServer
    root: Path
    events: list[Any]

    def tool_replies(self, request: int) -> list[str]:
        """The tool results the loop sent in chat request number ``request`` (1-based).

        Under the text protocol (``--tool-format text``) they are the user messages ``Result of NAME:``.
        """
        body = self.server.requests[request - 1]
        native = [m["content"] for m in body["messages"] if m["role"] == "tool"]
        as_text = [
            m["content"].split("\n", 1)[1]
            for m in body["messages"]
            if m["role"] == "user" and m["content"].startswith("Result of ")
        ]
        return native or as_text

    def results(self) -> list[IterationResult]:
        return [e for e in self.events if isinstance(e, IterationResult)]

    def history(self) -> list[str]:
        return Git(self.root, ProcessRunner())("log", "--format=%s").splitlines()


def start_session(
    registry: DirectoryRegistry,
    workdir: Path,
    fake_openai: Callable[..., FakeOpenAIServer],
    script: Any,
    clients: list[Any],
    *,
    timeout: float,
    stream: bool = True,
    before: Callable[[Path], None] | None = None,
    **options: Any,
) -> Session:
    """tinyhex forked under ``workdir``, a fake server replaying ``script``, and a loop on them (not run yet).

    The model client is appended to ``clients``, for the caller to close.
    """
    events: list[Any] = []
    bus = EventBus([events.append])
    runner = ProcessRunner()
    workspace = fork(
        registry.get("tinyhex"),
        registry,
        workdir / "workspaces",
        "tinyhex",
        runner=runner,
        bus=bus,
        cargo=Cargo(registry, runner),
    )
    if before is not None:
        before(workspace.path)
    server = fake_openai(script)
    model = ModelConfig.resolve(
        "scripted",
        base_url=server.base_url,
        timeout=timeout,
        stream=stream,
        tool_format=options.pop("tool_format", None),
    )
    assert model is not None
    # the loop's limits, the reply caps and the budget come from settings, as in a build: options override them
    chosen = {key: options.pop(key) for key in list(options) if key in SETTINGS}
    settings = Settings(cache_dir=workdir / "cache", **chosen)
    budget = Budget(settings.token_budget, max_cost=settings.max_cost, prices=settings.prices)
    channel = engineer_channel(model, bus=bus, budget=budget, limits=settings.reply_limits(), workspace=workspace.path)
    clients.append(channel)
    loop = EditLoop(
        workspace.path,
        channel,
        limits=settings.loop_limits(),
        bus=bus,
        git=Git(workspace.path, runner),
        crate=workspace.crate,
        cargo=Cargo(registry, runner, Sandbox(workspace.path)),
        **options,
    )
    return Session(loop, server, workspace.path, events)
