"""The scripted OpenAI-compatible test double, driven by the real ``openai`` client."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from flakebot_magic.testing.fake_openai import MODEL_NAME, FakeOpenAIServer, load_script

StartServer = Callable[..., FakeOpenAIServer]
USER = [{"role": "user", "content": "make me a tool that counts words"}]
ARGUMENTS = {"crate": "wc-rs", "features": ["cli", "unicode"], "explain": "counts words, lines and bytes"}
TOOL_CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_abc",
            "type": "function",
            "function": {"name": "choose_crate", "arguments": json.dumps(ARGUMENTS)},
        }
    ],
}
TEXT = {"role": "assistant", "content": "Here is the plan for your tool."}


@pytest.fixture
def client_for() -> Iterator[Callable[..., openai.OpenAI]]:
    """Real openai clients pointed at a fake; all closed at teardown."""
    clients: list[openai.OpenAI] = []

    def make(server: FakeOpenAIServer, max_retries: int = 0, timeout: float = 5.0) -> openai.OpenAI:
        client = openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=max_retries, timeout=timeout)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def recorded(server: FakeOpenAIServer) -> list[dict[str, Any]]:
    response = httpx.get(server.base_url.removesuffix("/v1") + "/_requests")
    response.raise_for_status()
    result: list[dict[str, Any]] = response.json()
    return result


def test_plain_text_reply(fake_openai: StartServer, client_for: Callable[..., openai.OpenAI]) -> None:
    server = fake_openai({"responses": [TEXT]})

    reply = client_for(server).chat.completions.create(model="gpt-4o", messages=USER)  # type: ignore[arg-type]

    assert reply.choices[0].message.content == TEXT["content"]
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None and reply.usage.completion_tokens == len(TEXT["content"]) // 4  # type: ignore[arg-type]
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_model_name_labels_it_a_test_double(fake_openai: StartServer, client_for: Callable[..., openai.OpenAI]) -> None:
    server = fake_openai([TEXT])
    client = client_for(server)

    reply = client.chat.completions.create(model="gpt-4o", messages=USER)  # type: ignore[arg-type]

    assert reply.model == MODEL_NAME == "scripted-test-double"
    assert [model.id for model in client.models.list()] == [MODEL_NAME]
    assert "test double" in server.label and server.base_url in server.label


def test_tool_call_reply(fake_openai: StartServer, client_for: Callable[..., openai.OpenAI]) -> None:
    server = fake_openai([TOOL_CALL])

    reply = client_for(server).chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]

    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.id == "call_abc" and call.type == "function"
    assert call.function.name == "choose_crate"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == ARGUMENTS  # type: ignore[union-attr]


def test_streamed_tool_call_arrives_in_pieces(
    fake_openai: StartServer, client_for: Callable[..., openai.OpenAI]
) -> None:
    server = fake_openai([TOOL_CALL])
    calls: dict[int, dict[str, str]] = {}
    argument_pieces = 0
    finish_reasons = []
    usage = None

    with client_for(server).chat.completions.create(
        model="m",
        messages=USER,  # type: ignore[arg-type]
        stream=True,
        stream_options={"include_usage": True},
    ) as stream:
        for chunk in stream:
            assert chunk.object == "chat.completion.chunk" and chunk.model == MODEL_NAME
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                finish_reasons.append(choice.finish_reason)
                for delta in choice.delta.tool_calls or []:
                    call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                    if delta.id:  # only the first chunk of a call carries id and name
                        assert not call["arguments"]
                        call["id"], call["name"] = delta.id, delta.function.name  # type: ignore[union-attr]
                    elif delta.function and delta.function.arguments:
                        argument_pieces += 1
                    call["arguments"] += (delta.function.arguments or "") if delta.function else ""

    assert calls == {0: {"id": "call_abc", "name": "choose_crate", "arguments": json.dumps(ARGUMENTS)}}
    assert json.loads(calls[0]["arguments"]) == ARGUMENTS
    assert argument_pieces > 2
    assert [reason for reason in finish_reasons if reason] == ["tool_calls"]
    assert usage is not None and usage.total_tokens > 0


def test_streamed_text_reassembles(fake_openai: StartServer, client_for: Callable[..., openai.OpenAI]) -> None:
    server = fake_openai([TEXT])

    with client_for(server).chat.completions.create(model="m", messages=USER, stream=True) as stream:  # type: ignore[arg-type]
        chunks = list(stream)

    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == TEXT["content"]
    assert len(chunks) > 3
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(chunk.usage is None for chunk in chunks)  # no usage chunk unless asked for


def test_rate_limit_is_retried_then_succeeds(
    fake_openai: StartServer, client_for: Callable[..., openai.OpenAI]
) -> None:
    server = fake_openai([{"fault": "status", "status": 429, "headers": {"Retry-After": "0"}}, TEXT])

    reply = client_for(server, max_retries=2).chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]

    assert reply.choices[0].message.content == TEXT["content"]
    assert len(server.requests) == 2


def test_rate_limit_without_retries_raises(fake_openai: StartServer, client_for: Callable[..., openai.OpenAI]) -> None:
    body = {"error": {"message": "slow down", "type": "rate_limit_error", "param": None, "code": "rate_limit"}}
    server = fake_openai([{"fault": "status", "status": 429, "headers": {"Retry-After": "0"}, "body": body}])

    with pytest.raises(openai.RateLimitError) as caught:
        client_for(server).chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]

    assert caught.value.status_code == 429
    assert caught.value.response.headers["retry-after"] == "0"
    assert caught.value.code == "rate_limit" and "slow down" in caught.value.message


def test_reset_without_retries_is_a_connection_error(
    fake_openai: StartServer, client_for: Callable[..., openai.OpenAI]
) -> None:
    server = fake_openai([{"fault": "reset"}, TEXT])

    with pytest.raises(openai.APIConnectionError) as caught:
        client_for(server).chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]

    assert not isinstance(caught.value, openai.APITimeoutError)
    assert server.remaining == 1


def test_reset_is_retried(fake_openai: StartServer, client_for: Callable[..., openai.OpenAI]) -> None:
    server = fake_openai([{"fault": "reset"}, TEXT])

    reply = client_for(server, max_retries=1).chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]

    assert reply.choices[0].message.content == TEXT["content"]
    assert len(server.requests) == 2


def test_reset_mid_stream(fake_openai: StartServer, client_for: Callable[..., openai.OpenAI]) -> None:
    server = fake_openai([{"fault": "reset", "after_chunks": 2, "message": TOOL_CALL}, TEXT])
    received = []

    # The SDK never retries once a stream has started: the error reaches the reader.
    with (
        pytest.raises(openai.APIConnectionError),
        client_for(server, max_retries=2).chat.completions.create(
            model="m",
            messages=USER,  # type: ignore[arg-type]
            stream=True,
        ) as stream,
    ):
        for chunk in stream:
            received.append(chunk)

    assert len(received) == 2
    assert received[1].choices[0].delta.tool_calls[0].function.name == "choose_crate"  # type: ignore[index,union-attr]
    assert len(server.requests) == 1


def test_malformed_body_raises_json_decode_error(
    fake_openai: StartServer, client_for: Callable[..., openai.OpenAI]
) -> None:
    server = fake_openai([{"fault": "malformed"}])

    # The SDK does not wrap this one: a bare json.JSONDecodeError (a ValueError) escapes.
    with pytest.raises(json.JSONDecodeError):
        client_for(server).chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]


def test_malformed_stream_raises_json_decode_error(
    fake_openai: StartServer, client_for: Callable[..., openai.OpenAI]
) -> None:
    server = fake_openai([{"fault": "malformed"}])

    with pytest.raises(json.JSONDecodeError):
        with client_for(server).chat.completions.create(model="m", messages=USER, stream=True) as stream:  # type: ignore[arg-type]
            list(stream)


def test_stall_past_the_client_timeout(fake_openai: StartServer, client_for: Callable[..., openai.OpenAI]) -> None:
    server = fake_openai([{"fault": "stall", "seconds": 5}, TEXT])

    with pytest.raises(openai.APITimeoutError):
        client_for(server, timeout=0.3).chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]

    assert server.remaining == 0  # the stall and the answer it held back are both spent


def test_short_stall_answers_with_the_next_item(
    fake_openai: StartServer, client_for: Callable[..., openai.OpenAI]
) -> None:
    server = fake_openai([{"fault": "stall", "seconds": 0.2}, TEXT])

    reply = client_for(server).chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]

    assert reply.choices[0].message.content == TEXT["content"]


def test_requests_are_recorded(fake_openai: StartServer, client_for: Callable[..., openai.OpenAI]) -> None:
    server = fake_openai([TEXT, TOOL_CALL])
    client = client_for(server)
    client.chat.completions.create(model="gpt-4o", messages=USER)  # type: ignore[arg-type]
    follow_up = [*USER, TEXT, {"role": "user", "content": "pick a crate"}]
    client.chat.completions.create(
        model="gpt-4o",
        messages=follow_up,  # type: ignore[arg-type]
        tools=[{"type": "function", "function": {"name": "choose_crate", "parameters": {"type": "object"}}}],
    )

    records = recorded(server)

    assert [(r["method"], r["path"]) for r in records] == [("POST", "/v1/chat/completions")] * 2
    assert records[0]["body"]["messages"] == USER
    assert records[1]["body"]["messages"] == follow_up
    assert records[1]["body"]["tools"][0]["function"]["name"] == "choose_crate"
    assert records[0]["headers"]["authorization"] == "Bearer <redacted>"
    assert [r["queue"] for r in records] == ["responses", "responses"]  # a plain script has one queue
    assert server.requests == [r["body"] for r in records]
    assert server.records == records


def test_exhausted_script_is_a_500(fake_openai: StartServer, client_for: Callable[..., openai.OpenAI]) -> None:
    server = fake_openai([TEXT])
    client = client_for(server, max_retries=2)
    client.chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]

    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]

    assert caught.value.status_code == 500
    assert "script ran out" in caught.value.message and "request 2" in caught.value.message
    assert len(server.requests) == 2  # x-should-retry: false stops the SDK retrying


def test_script_from_a_file(tmp_path: Path, client_for: Callable[..., openai.OpenAI]) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [TEXT]}))

    with FakeOpenAIServer(script) as server:
        reply = client_for(server).chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]
        assert str(script) in server.label

    assert reply.choices[0].message.content == TEXT["content"]


@pytest.mark.parametrize(
    "item",
    [
        {"fault": "explode"},
        {"fault": "status"},
        {"fault": "stall"},
        {"role": "user", "content": "hi"},
        {"role": "assistant"},
        {"role": "assistant", "tool_calls": [{"function": {}}]},
    ],
)
def test_bad_script_items_are_refused(item: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="item 1"):
        load_script([TEXT, item])


def test_only_loopback() -> None:
    with pytest.raises(ValueError, match=r"127\.0\.0\.1"):
        FakeOpenAIServer([TEXT], host="0.0.0.0")


def test_cli_prints_label_and_url(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [TEXT, TOOL_CALL]}))
    command = [sys.executable, "-m", "flakebot_magic.testing.fake_openai", "--script", str(script)]

    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
        try:
            label = process.stdout.readline()  # type: ignore[union-attr]
            url = process.stdout.readline().strip()  # type: ignore[union-attr]
            models = httpx.get(url + "/models").json()
        finally:
            process.terminate()
        assert process.wait(timeout=10) == 0

    assert label.startswith("fake-openai: scripted test double (not a language model) replaying 2 responses")
    assert str(script) in label and url in label
    assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
    assert models["data"][0]["id"] == MODEL_NAME


# -- model dialects: calls written into the text, as servers without a tool parser pass them ------------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("dialect", ["qwen", "llama", "json", "mistral"])
def test_a_scripted_reply_in_a_dialect_is_text_with_the_calls_written_in(
    fake_openai: StartServer, client_for: Callable[..., openai.OpenAI], dialect: str, stream: bool
) -> None:
    from flakebot_magic.llm.dialects import TextCall, read_calls

    item = {**TOOL_CALL, "content": "I choose:", "dialect": dialect, "after": "Done."}
    server = fake_openai([item])
    client = client_for(server)
    if stream:
        chunks = list(client.chat.completions.create(model="m", messages=USER, stream=True))  # type: ignore[call-overload]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert not any(c.choices[0].delta.tool_calls for c in chunks if c.choices)
    else:
        message = client.chat.completions.create(model="m", messages=USER).choices[0].message  # type: ignore[arg-type]
        assert message.tool_calls is None
        text = message.content or ""
    assert text.startswith("I choose:\n") and text.endswith("\nDone.")
    found = read_calls(text, ["choose_crate"])
    assert found is not None and list(found.calls) == [TextCall("choose_crate", ARGUMENTS)]


def test_a_scripted_cut_and_finish_reason(fake_openai: StartServer, client_for: Callable[..., openai.OpenAI]) -> None:
    server = fake_openai([{**TOOL_CALL, "dialect": "qwen", "cut": 30, "finish_reason": "length"}])
    choice = client_for(server).chat.completions.create(model="m", messages=USER).choices[0]  # type: ignore[arg-type]
    assert choice.finish_reason == "length" and len(choice.message.content or "") == 30


@pytest.mark.parametrize(
    ("item", "problem"),
    [
        ({**TOOL_CALL, "dialect": "xml"}, 'unknown "dialect"'),
        ({**TOOL_CALL, "dialect": "qwen", "cut": 10_000}, '"cut" must be'),
        ({**TEXT, "after": "x"}, 'only go with "dialect"'),
        ({**TEXT, "finish_reason": "tired"}, '"finish_reason" must be one of'),
    ],
)
def test_bad_dialect_items_are_refused(item: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError, match=re.escape(problem)):
        load_script([item])
