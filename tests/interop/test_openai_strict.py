"""The ``openai`` SDK's own strict-schema helper agrees with every schema the clients generate."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from interop_tools import needs_fixture_crates

from flakebot_magic.clients.agents import NAME_PATTERN, strict_problems

openai = pytest.importorskip("openai", reason="openai is in the `test` extra")
_pydantic = pytest.importorskip("openai.lib._pydantic", reason="this openai has no strict-schema helper")


def assert_strict(tools: list[dict[str, Any]]) -> None:
    """Each schema is a fixed point of the SDK's helper (it changes nothing: already strict) and of our rules."""
    assert tools
    for tool in tools:
        function = tool["function"]
        assert function["strict"] is True and NAME_PATTERN.match(function["name"]), function["name"]
        schema = function["parameters"]
        before = copy.deepcopy(schema)
        made = _pydantic._ensure_strict_json_schema(copy.deepcopy(schema), path=(), root=copy.deepcopy(schema))
        assert made == before, f"{function['name']}: the openai helper changed it:\n{json.dumps(made, indent=1)}"
        assert strict_problems(schema) == []


@pytest.mark.cargo
@needs_fixture_crates
def test_the_mcp_tool_s_schemas(calc: Any) -> None:
    tools = calc.openai_tools()
    assert_strict(tools)
    assert [t["function"]["name"] for t in tools][3] == "calc_pid"


@pytest.mark.cargo
@needs_fixture_crates
def test_the_http_service_s_schemas(svc: Any) -> None:
    assert_strict(svc.openai_tools())


def test_a_cli_tool_s_schemas(shout: Any) -> None:
    assert_strict(shout.openai_tools())


def test_the_helper_is_not_a_no_op() -> None:
    """The check can fail: an open, all-optional schema is changed by the helper."""
    loose = {"type": "object", "properties": {"a": {"type": "string"}}}
    made = _pydantic._ensure_strict_json_schema(copy.deepcopy(loose), path=(), root=copy.deepcopy(loose))
    assert made != loose and made["additionalProperties"] is False
