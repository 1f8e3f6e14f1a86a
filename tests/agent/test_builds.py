"""Agent builds and their limits: the model tokens a build is charged are what its edit loop reports it spent."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from flakebot_magic.agent.builds import AgentSession, _TokenMeter
from flakebot_magic.config import Settings
from flakebot_magic.errors import ConfigError, EditError
from flakebot_magic.events import ModelUsage, StageFinished, StageStarted
from flakebot_magic.testing.fake_openai import FakeOpenAIServer
from flakebot_magic.testing.openai_wire import usage


def test_the_token_budget_of_a_session(agent_settings: Settings) -> None:
    agent_settings.model = "scripted-test-double"
    agent_settings.agent_token_budget = 1000
    session = AgentSession(agent_settings, requested_by="t")
    session.tokens = 1000
    assert "agent_token_budget" in (session.refusal() or "")
    with pytest.raises(ConfigError, match="spent 1,000 of their 1,000"):
        session.start("anything")
    assert session.builds == 0


def test_the_meter_adds_what_the_edit_loop_reports() -> None:
    meter = _TokenMeter()
    meter(StageStarted("edit"))
    # the stage's text is for people: a number in it is not read
    meter(StageFinished("edit", "done", "green after 2 iteration(s), 3 model call(s), 1,234 tokens; cli: ok"))
    assert meter.tokens == 0
    meter(ModelUsage(1234, calls=3))
    meter(ModelUsage(66, calls=1))  # a second edit session in the same build (a follow-up)
    assert meter.tokens == 1300


@pytest.mark.cargo
def test_a_failed_edit_is_charged_what_it_spent_not_the_budget(
    agent_settings: Settings, fake_openai: Callable[..., FakeOpenAIServer]
) -> None:
    """The model never calls a tool: the loop gives up after four replies; the session pays for those four."""
    script = [{"role": "assistant", "content": f"Let me think about it ({n})."} for n in range(4)]
    server = fake_openai(script)
    agent_settings.model = "scripted-test-double"
    agent_settings.base_url = server.base_url
    agent_settings.token_budget = 300_000
    agent_settings.agent_token_budget = 1_000_000
    session = AgentSession(agent_settings, requested_by="t")
    seen: list[Any] = []
    with pytest.raises(EditError, match="stopped using the tools"):
        session.build("echo words", crate="tinyecho", name="thinker", observers=[seen.append])
    # running totals after each reply, then the session's final word
    reported = [e for e in seen if isinstance(e, ModelUsage) and e.final]
    assert [(e.stage, e.calls) for e in reported] == [("edit", 4)]
    running = [e.calls for e in seen if isinstance(e, ModelUsage) and not e.final]
    assert running == [1, 2, 3, 4]
    # what the model's API reported, request by request (the test double counts like the real usage field)
    spent = sum(usage(request, reply)["total_tokens"] for request, reply in zip(server.requests, script, strict=True))
    assert reported[0].tokens == spent > 0
    assert session.tokens == spent < agent_settings.token_budget
    assert session.builds == 1


@pytest.mark.cargo
def test_an_agent_never_replaces_a_tool_someone_else_asked_for(agent_settings: Settings) -> None:
    """A16: the agent picks the name (a prompt injection can too); the user's tool of that name stays as it was."""
    from dataclasses import replace

    from flakebot_magic.errors import UsageError
    from flakebot_magic.pipeline import Pipeline
    from flakebot_magic.records.inventory import Inventory
    from flakebot_magic.request import BuildRequest

    settings = replace(agent_settings, allow_agent_builds=True)
    Pipeline(settings).run(BuildRequest("", crate="tinyecho", name="jq"))
    before = Inventory(settings.cache.tools).get("jq")
    agent = AgentSession(settings, requested_by="some-mcp-client")
    with pytest.raises(UsageError, match="built for the user; an agent's build may not replace it"):
        agent.build("a faster jq", name="jq", crate="slowbuild")
    after = Inventory(settings.cache.tools).get("jq")
    assert before is not None and after is not None
    assert (after.crate, after.store_path, after.workspace) == (before.crate, before.store_path, before.workspace)
    # its own tool, it may build again; and without a name the crate's name is checked the same way
    agent.build("", name="echo2", crate="tinyecho")
    assert agent.build("again", name="echo2", crate="tinyecho").tool.name == "echo2"
    with pytest.raises(UsageError, match="may not replace"):
        AgentSession(settings, requested_by="another-client").build("", crate="tinyecho", name="echo2")
