"""The chat-completions JSON a fake-openai server sends: completions, stream deltas, usage, error bodies."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["LABEL", "MODEL_NAME", "completion", "deltas", "error_body", "finish_reason", "usage"]

MODEL_NAME = "scripted-test-double"
"""The model name in every reply, whatever model the request asked for."""

LABEL = "scripted test double (not a language model)"

_ARGUMENT_PIECE = 8  # characters of tool-call arguments per streamed chunk


def error_body(message: str, kind: str, code: str | None = None) -> dict[str, Any]:
    """An OpenAI-shaped ``{"error": {...}}`` body."""
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _text_length(value: object) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, Mapping):
        return sum(_text_length(v) for k, v in value.items() if k in ("text", "content", "arguments", "name"))
    if isinstance(value, list):
        return sum(_text_length(v) for v in value)
    return 0


def usage(request: Mapping[str, Any], message: Mapping[str, Any]) -> dict[str, int]:
    """Rough token counts (four characters a token), enough for callers that read ``usage``."""
    prompt = _text_length(request.get("messages", [])) // 4
    completion = _text_length(message.get("content") or "") // 4
    for call in message.get("tool_calls", []):
        completion += (len(call["function"]["name"]) + len(call["function"]["arguments"])) // 4
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def finish_reason(message: Mapping[str, Any], scripted: str | None = None) -> str:
    """``scripted`` when the script gave one, else ``tool_calls`` when the message calls a tool, else ``stop``."""
    return scripted or ("tool_calls" if message.get("tool_calls") else "stop")


def deltas(message: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Split a message into chat.completion.chunk deltas the way OpenAI streams them."""
    content = message.get("content")
    tool_calls = message.get("tool_calls", [])
    yield {"role": "assistant", "content": "" if content is not None else None, "refusal": None}
    for piece in re.findall(r"\s*\S+\s*|\s+", content or ""):
        yield {"content": piece}
    for index, call in enumerate(tool_calls):
        function = call["function"]
        yield {
            "tool_calls": [
                {
                    "index": index,
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": function["name"], "arguments": ""},
                }
            ]
        }
        arguments = function["arguments"]
        for start in range(0, len(arguments), _ARGUMENT_PIECE):
            piece = arguments[start : start + _ARGUMENT_PIECE]
            yield {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}


def completion(
    request: Mapping[str, Any],
    number: int,
    message: Mapping[str, Any],
    scripted_usage: Mapping[str, Any] | None = None,
    finish: str | None = None,
) -> dict[str, Any]:
    """The non-streamed ``chat.completion`` answering ``request`` (the ``number``-th) with ``message``.

    Its ``usage`` is ``scripted_usage`` when the script gave one, else the
    rough estimate of ``usage``.
    """
    return {
        "id": f"chatcmpl-testdouble-{number}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": MODEL_NAME,
        "system_fingerprint": None,
        "choices": [
            {"index": 0, "message": dict(message), "logprobs": None, "finish_reason": finish_reason(message, finish)}
        ],
        "usage": dict(scripted_usage) if scripted_usage is not None else usage(request, message),
    }
