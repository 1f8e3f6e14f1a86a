"""OpenAI strict-mode schemas, tool-call execution, and the JSON Schema -> Python function mapping."""

from __future__ import annotations

import inspect
import json
import math
from typing import Any

import pytest

from flakebot_magic.clients.agents import ToolFunction, agent_name, parse_tool_call, strict_problems, strict_schema
from flakebot_magic.clients.base import ToolClient
from flakebot_magic.clients.schema import (
    check_arguments,
    docstring_of,
    make_function,
    prepare_arguments,
    python_name,
    sentence,
)

SCHEMA = {
    "type": "object",
    "properties": {
        "text": {"type": "string", "minLength": 1, "description": "what to say"},
        "times": {"type": "integer", "minimum": 1, "maximum": 5, "default": 1},
        "mode": {"type": "string", "enum": ["a", "b"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "options": {"type": "object"},
        "point": {
            "type": "object",
            "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
            "required": ["x"],
        },
        "either": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
        "class": {"type": "boolean"},
    },
    "required": ["text"],
}


def test_strict_schema_follows_the_rules() -> None:
    assert strict_problems(SCHEMA)  # the original breaks them
    strict, json_text = strict_schema(SCHEMA)
    assert strict_problems(strict) == []
    properties = strict["properties"]
    assert strict["required"] == list(SCHEMA["properties"]) and strict["additionalProperties"] is False
    assert properties["text"] == {
        "type": "string",
        "description": "what to say (minLength: 1)",
    }  # required: not nullable
    assert properties["times"]["type"] == ["integer", "null"]
    assert properties["times"]["description"] == "(default: 1; minimum: 1; maximum: 5)"
    assert properties["mode"]["enum"] == ["a", "b", None]
    assert properties["point"]["properties"]["y"]["type"] == ["number", "null"]  # nested optional
    assert properties["point"]["required"] == ["x", "y"]
    assert {"type": "null"} in properties["either"]["anyOf"]
    assert json_text == ("options",) and properties["options"]["type"] == ["string", "null"]


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        (
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": []},
            "every property must be required",
        ),
        ({"type": "object", "properties": {}, "required": []}, "additionalProperties must be false"),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "string", "format": "date"}},
                "required": ["a"],
                "additionalProperties": False,
            },
            "'format'",
        ),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "array"}},
                "required": ["a"],
                "additionalProperties": False,
            },
            "needs items",
        ),
        (
            {
                "type": "object",
                "properties": {"a": {"type": ["string", "null"], "enum": ["x"]}},
                "required": ["a"],
                "additionalProperties": False,
            },
            "must list null",
        ),
        ({"type": "string"}, "root must be an object"),
    ],
)
def test_strict_problems_finds_each_rule(schema: dict[str, Any], problem: str) -> None:
    assert any(problem in p for p in strict_problems(schema))


def test_make_function_has_a_signature_and_checks_arguments() -> None:
    sent: list[dict[str, Any]] = []
    fn = make_function("say", SCHEMA, lambda args: sent.append(args) or "ok", doc="Say it.")
    signature = inspect.signature(fn)
    assert next(iter(signature.parameters)) == "text"
    assert signature.parameters["text"].default is inspect.Parameter.empty
    assert "class_" in signature.parameters  # a keyword becomes a usable name
    assert fn.__doc__ == "Say it." and fn.__name__ == "say"
    assert fn("hi", times=2, class_=True) == "ok"
    assert sent[-1] == {"text": "hi", "times": 2, "class": True}  # None-valued optionals are left out
    with pytest.raises(TypeError, match="missing a required argument: 'text'"):
        fn()
    with pytest.raises(ValueError, match="'times' must be at most 5"):
        fn("hi", times=9)
    with pytest.raises(TypeError, match=r"'tags'\[1\] must be str"):
        fn("hi", tags=["a", 2])
    with pytest.raises(ValueError, match="'tags' must have at most 3 items"):
        fn("hi", tags=["a", "b", "c", "d"])
    with pytest.raises(TypeError, match=r"'point'\['x'\]|missing 'x'"):
        fn("hi", point={"y": 1})
    with pytest.raises(TypeError, match="'either' must be str or int"):
        fn("hi", either=1.5)
    assert fn("hi", either=3, mode="b") == "ok"
    check_arguments({"text": "x"}, SCHEMA)
    assert python_name("dry-run") == "dry_run" and python_name("2d") == "_2d" and python_name("self") == "self_"


class _Echo(ToolClient):
    kind = "cli"

    def functions(self) -> dict[str, ToolFunction]:
        schema = {
            "type": "object",
            "properties": {"text": {"type": "string"}, "loud": {"type": "boolean"}, "extra": {"type": "object"}},
            "required": ["text"],
        }

        def send(args: dict[str, Any]) -> Any:
            if args["text"] == "fail":
                raise ValueError("asked to fail")
            return {"said": args["text"].upper() if args.get("loud") else args["text"], "extra": args.get("extra")}

        fn = make_function("echo", schema, send, doc="Echo.")
        return {"echo": ToolFunction("echo", "Echo a text.", schema, fn, example="echo(text='hi')", wire=send)}


def _echo() -> _Echo:
    return _Echo(name="echo", binary="/bin/echo", crate="echo", version="1.0", source_hash="0", store_path="/")


def test_call_runs_a_tool_call_and_returns_the_tool_message() -> None:
    echo = _echo()
    (tool,) = echo.openai_tools()
    assert tool["function"]["name"] == "echo"  # a single function named like the tool keeps the name
    arguments = json.dumps({"text": "hi", "loud": True, "extra": json.dumps({"k": 1})})
    message = echo.call({"id": "call_9", "type": "function", "function": {"name": "echo", "arguments": arguments}})
    assert message == {"role": "tool", "tool_call_id": "call_9", "content": '{"said": "HI", "extra": {"k": 1}}'}
    nulls = echo.call(
        {"id": "c", "function": {"name": "echo", "arguments": '{"text": "a", "loud": null, "extra": null}'}}
    )
    assert json.loads(nulls["content"]) == {"said": "a", "extra": None}
    failed = echo.call({"id": "c", "function": {"name": "echo", "arguments": '{"text": "fail"}'}})
    assert failed["content"] == "error: ValueError: asked to fail"
    bad = echo.call({"id": "c", "function": {"name": "echo", "arguments": '{"text": 3}'}})
    assert bad["content"].startswith("error: TypeError: echo(): argument 'text' must be str")
    broken = echo.call({"id": "c", "function": {"name": "echo", "arguments": "{not json"}})
    assert broken["content"].startswith("error: JSONDecodeError")
    assert echo.handles({"function": {"name": "echo"}}) and not echo.handles({"function": {"name": "other"}})


def test_parse_tool_call_reads_openai_objects() -> None:
    openai = pytest.importorskip("openai")
    from openai.types.chat import ChatCompletionMessageToolCall

    call = ChatCompletionMessageToolCall(id="c1", type="function", function={"name": "f", "arguments": "{}"})
    assert parse_tool_call(call) == ("c1", "f", "{}")
    assert openai is not None


def test_prepare_arguments_is_the_one_rule_for_what_goes_out() -> None:
    schema = {
        "type": "object",
        "properties": {
            "n": {"type": "integer"},
            "x": {"type": "number"},
            "either": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
            "ns": {"type": "array", "items": {"type": "integer"}},
            "point": {"type": "object", "properties": {"i": {"type": "integer"}}},
            "maybe": {"type": ["string", "null"]},
        },
        "required": ["n", "maybe"],
    }
    out = prepare_arguments(
        {"n": 2.0, "x": 2.0, "either": 3.0, "ns": [1.0, 2], "point": {"i": 4.0}, "maybe": None}, schema, "f"
    )
    assert out == {"n": 2, "x": 2.0, "either": 3, "ns": [1, 2], "point": {"i": 4}, "maybe": None}
    assert [type(out[k]) for k in ("n", "x", "either")] == [int, float, int] and type(out["ns"][0]) is int
    assert prepare_arguments({"n": 1, "maybe": "m", "x": None, "point": None}, schema) == {"n": 1, "maybe": "m"}
    with pytest.raises(TypeError, match=r"f\(\): argument 'n' must be int, not float 2.5"):
        prepare_arguments({"n": 2.5, "maybe": None}, schema, "f")
    with pytest.raises(TypeError, match="'n' must be int, not NoneType None"):
        prepare_arguments({"n": None, "maybe": None}, schema, "f")  # null for a required argument is a value
    for bad, where in (
        ({"x": math.nan}, "'x'"),
        ({"ns": [1, math.inf]}, r"'ns'\[1\]"),
        ({"point": {"i": -math.inf}}, r"'point'\['i'\]"),
    ):
        with pytest.raises(ValueError, match=rf"f\(\): argument {where} is NaN or infinite, which JSON cannot carry"):
            prepare_arguments({"n": 1, "maybe": None, **bad}, schema, "f")
    open_schema = {"type": "object", "properties": {"free": {"type": "object"}}}
    with pytest.raises(ValueError, match=r"argument 'free'\['deep'\] is NaN"):
        prepare_arguments({"free": {"deep": math.nan}}, open_schema)


def test_names_are_kept_where_valid() -> None:
    def fn(name: str, remote: str = "") -> ToolFunction:
        return ToolFunction(name, "", {"type": "object"}, lambda: None, remote_name=remote)

    assert agent_name("calc", fn("pid_", "pid")) == "calc_pid"  # the Python attribute's `_` is not the tool's name
    assert agent_name("calc", fn("get_x", "get.x")) == "calc_get_x"  # a dot is not valid for OpenAI
    assert agent_name("svc", fn("greet", "GET /greet")) == "svc_greet"  # an HTTP route is no name
    assert agent_name("md", fn("md"), alone=True) == "md" and agent_name("md", fn("md")) == "md_md"
    assert fn("pid_", "pid").public_name == "pid" and fn("a_b", "a b").public_name == "a_b"
    assert len(agent_name("t", fn("x" * 80, "x" * 80))) == 64


def test_enforced_schema_says_extra_keys_are_refused() -> None:
    closed = ToolFunction("f", "", {"type": "object", "properties": {}}, lambda: None)
    assert closed.enforced_schema["additionalProperties"] is False
    assert (
        "additionalProperties"
        not in ToolFunction("f", "", {"type": "object"}, lambda: None, open_arguments=True).enforced_schema
    )
    echo = _echo()
    extra = echo.call({"id": "c", "function": {"name": "echo", "arguments": '{"text": "a", "volume": 11}'}})
    assert extra["content"] == (
        "error: TypeError: echo(): got an unexpected argument 'volume' (it takes 'text', 'loud', 'extra')"
    )


def test_summaries_end_in_a_full_stop() -> None:
    assert sentence("A command-line hex viewer") == "A command-line hex viewer."
    assert sentence("Done!") == "Done!" and sentence("Options:") == "Options:" and sentence("") == ""
    doc = docstring_of("A hex viewer\n\nGET /x on the service", [], "str", "ToolError")
    assert doc.startswith("A hex viewer.\n\nGET /x on the service.\n")
