"""``flakebot_magic.agent_tools()`` and ``flakebot_magic.call()``: a scripted chat builds a tool and calls it.

The model is the project's scripted fake OpenAI server (a labelled test
double); the build is real (cargo, the tiny registry).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest

import flakebot_magic
from flakebot_magic.clients.agents import strict_problems
from flakebot_magic.config import Settings
from flakebot_magic.records.inventory import Inventory
from flakebot_magic.testing.fake_openai import FakeOpenAIServer


def _call(ident: str, function: str, /, **arguments: Any) -> dict[str, Any]:
    return {"id": ident, "type": "function", "function": {"name": function, "arguments": json.dumps(arguments)}}


def test_agent_tools_are_strict_and_name_flakebots_functions(agent_settings: Settings) -> None:
    tools = flakebot_magic.agent_tools(cache_dir=agent_settings.cache_dir, registry=agent_settings.registry)
    assert [t["function"]["name"] for t in tools] == ["build_tool", "search_crates"]
    for tool in tools:
        assert tool["function"]["strict"] is True
        assert strict_problems(tool["function"]["parameters"]) == []
    assert tools[0]["function"]["parameters"]["properties"]["crate"]["type"] == ["string", "null"]


@pytest.mark.cargo
def test_a_scripted_chat_builds_a_tool_then_calls_it(
    agent_settings: Settings, fake_openai: Callable[..., FakeOpenAIServer]
) -> None:
    options = {"cache_dir": agent_settings.cache_dir, "registry": agent_settings.registry}
    script = [  # the test double's replies, in order: not a model's output
        {"role": "assistant", "content": None, "tool_calls": [
            _call("c1", "build_tool", request="shout text", crate="tinyecho", name="shout")
        ]},
        {"role": "assistant", "content": None, "tool_calls": [_call("c2", "shout", input="quiet please", words=None)]},
        {"role": "assistant", "content": "It says QUIET PLEASE."},
    ]  # fmt: skip
    server = fake_openai(script)
    client = openai.OpenAI(base_url=server.base_url, api_key="none: a test double")
    messages: list[Any] = [{"role": "user", "content": "I need text shouted."}]
    results = []
    offered = []
    while True:
        tools = flakebot_magic.agent_tools(**options)
        offered.append([t["function"]["name"] for t in tools])
        reply = client.chat.completions.create(model="scripted-test-double", messages=messages, tools=tools)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for tool_call in message.tool_calls:
            result = flakebot_magic.call(tool_call, **options)
            results.append(result)
            messages.append(result)
    client.close()
    assert results[0]["tool_call_id"] == "c1" and "Built `shout`" in results[0]["content"], results[0]
    assert results[1] == {"role": "tool", "tool_call_id": "c2", "content": "QUIET PLEASE"}
    # the new tool was offered to the model in the turn after the build, with a strict schema
    assert "shout" not in offered[0] and "shout" in offered[1]
    sent = {t["function"]["name"]: t for t in server.requests[1]["tools"]}
    assert strict_problems(sent["shout"]["function"]["parameters"]) == []
    record = Inventory(agent_settings.cache.tools).get("shout")
    assert record is not None and record.requested_by == "notebook"
    assert flakebot_magic.manage.tools.show(agent_settings, "shout").data["provenance"]["requested_by"] == "notebook"


def test_a_failure_is_the_tool_message_the_model_reads(agent_settings: Settings) -> None:
    options = {"cache_dir": agent_settings.cache_dir, "registry": agent_settings.registry}
    unknown = flakebot_magic.call(_call("x", "nothing_here"), **options)
    assert unknown["tool_call_id"] == "x" and unknown["content"].startswith("error: there is no function")
    bad = flakebot_magic.call({"id": "y", "function": {"name": "build_tool", "arguments": "[1]"}}, **options)
    assert bad["content"] == "error: ValueError: the arguments must be a JSON object"
    refused = flakebot_magic.call(_call("z", "build_tool", request="echo"), allow_agent_builds=False, **options)
    assert "allow_agent_builds" in refused["content"]


def test_mcp_config_starts_flakebot_mcp(tmp_path: Path) -> None:
    from flakebot_magic.agent import mcp_config

    entry = mcp_config(cache_dir=tmp_path, registry="/r")["mcpServers"]["flakebot"]
    assert Path(entry["command"]).name == "flakebot" and entry["args"] == ["mcp", "--registry", "/r"]
    assert entry["env"] == {"FLAKEBOT_CACHE_DIR": str(tmp_path)}


# -- one session per kernel and cache dir -------------------------------------------------------------------------


class _Kernel:
    """Stands for a kernel's IPython shell: what a session is keyed by (weakly)."""


def test_other_options_keep_the_sessions_count_and_apply_their_limits(agent_settings: Settings) -> None:
    from flakebot_magic.agent import notebook

    kernel = _Kernel()
    cache = agent_settings.cache_dir

    def agent(**options: Any) -> Any:
        return notebook._AGENTS.get(
            kernel, *notebook._settings(cache, {"registry": agent_settings.registry, **options})
        )

    first = agent(agent_max_builds=1)
    first.session.builds = 1  # one build made (its count; the build itself is another test's)
    assert "1 agent builds allowed here are used" in (first.session.refusal() or "")
    other = agent(agent_max_builds=1, tool_timeout=5.0, model_timeout=7.0)  # any other option: the same session
    assert other is first and other.session.builds == 1
    assert "1 agent builds allowed here are used" in (other.session.refusal() or "")
    raised = agent(agent_max_builds=2)  # the user raised the limit: it applies, the count stays
    assert raised is first and raised.session.refusal() is None and raised.settings.agent_max_builds == 2
    assert raised.catalog.settings == raised.settings  # the tools' clients follow the settings too


def test_another_cache_dir_or_kernel_is_another_session(agent_settings: Settings, tmp_path: Path) -> None:
    from flakebot_magic.agent import notebook

    one, two = _Kernel(), _Kernel()
    here, _ = notebook._settings(agent_settings.cache_dir, {})
    there, _ = notebook._settings(tmp_path / "other-cache", {})
    a = notebook._AGENTS.get(one, here)
    assert notebook._AGENTS.get(one, there) is not a
    assert notebook._AGENTS.get(two, here) is not a
    assert notebook._AGENTS.get(one, here) is a


def test_a_kernels_sessions_go_with_it_and_are_bounded(agent_settings: Settings, tmp_path: Path) -> None:
    import gc

    from flakebot_magic.agent.notebook import _Agents, _settings

    agents = _Agents(per_kernel=3)
    kernel = _Kernel()
    busy = agents.get(kernel, _settings(tmp_path / "cache-0", {})[0])
    busy.busy(+1)  # a build under way: never dropped
    for index in range(1, 10):
        agents.get(kernel, _settings(tmp_path / f"cache-{index}", {})[0])
    assert agents.count() == 3
    assert agents.get(kernel, _settings(tmp_path / "cache-0", {})[0]) is busy
    other = _Kernel()
    agents.get(other, _settings(tmp_path / "cache-1", {})[0])
    assert agents.count() == 4
    del kernel
    gc.collect()
    assert agents.count() == 1  # the ended kernel's sessions are gone; the other kernel's stays


def test_an_agents_run_flags_go_into_its_builds_requests_not_its_settings(tmp_path: Path) -> None:
    """``call(..., candidates=2, plan=True)``: the agent's session builds with those flags (RunFlags); its settings
    get the rest; other flags apply to the kernel's one session."""
    from flakebot_magic.agent.notebook import _agent, _settings
    from flakebot_magic.request import RunFlags

    settings, flags = _settings(tmp_path, {"candidates": 2, "plan": True, "token_budget": 5000})
    assert flags == RunFlags(candidates=2, plan=True) and settings.token_budget == 5000
    agent = _agent(tmp_path, candidates=2, plan=True)
    assert agent.session.flags == flags
    assert _agent(tmp_path, candidates=3).session.flags.candidates == 3  # other flags apply to the same session
