"""The conversation within the model's context: long texts cut in the middle, older turns compacted to stubs.

Three tools, used by the session on each request:

* :func:`cap_middle` cuts a text (a file read, diagnostics, 5 MB of test
  output) to a byte cap, keeping its head and its tail (where a compiler's
  first error and a test run's summary are) around an explicit marker;
* :func:`~flakebot_magic.llm.usage.estimate_tokens` (the channel's own
  estimate) says how big a conversation is;
* :func:`compact` shrinks a conversation that nears the context size.

:func:`compact` keeps the first two messages (the system prompt and the
request) byte-identical and leaves earlier stubs unchanged when it runs
again, so the start of every request is the same text and a provider's
prompt cache keeps serving it. It never separates an assistant message's
``tool_calls`` from the ``tool`` messages that answer them: results are
replaced by stubs that keep their ``tool_call_id``, and a turn is dropped
whole or not at all.
"""

from __future__ import annotations

import json
from typing import Any

from ..host.fsutil import load_json
from .usage import BYTES_PER_TOKEN, estimate_tokens, message_tokens

__all__ = ["COMPACT_AT", "COMPACT_TO", "cap_middle", "compact"]

#: a conversation past this share of the context size is compacted ...
COMPACT_AT = 0.75
#: ... to under this share (room for the model's reply and a few more turns before the next compaction)
COMPACT_TO = 0.5
#: an older message's text longer than this many bytes becomes a stub
_STUB_OVER = 600
#: what is left of a long text in a stub
_STUB_KEEP = 240


def cap_middle(text: str, limit_bytes: int) -> str:
    """``text`` within ``limit_bytes`` bytes of UTF-8: its head and tail kept, the middle replaced by a marker.

    The marker says how much was cut: ``[... 5,242,880 bytes cut from the
    middle ...]``. A character is never split; the result is at most
    ``limit_bytes`` bytes.

    >>> cap_middle("short", 100)
    'short'
    >>> cap_middle("a" * 50 + "b" * 50, 70)
    'aaaaaaaaaaaaaaa\\n[... 71 bytes cut from the middle ...]\\nbbbbbbbbbbbbbb'
    """
    data = text.encode("utf-8", errors="surrogatepass")
    if len(data) <= limit_bytes:
        return text
    limit_bytes = max(limit_bytes, 0)
    marker_room = len(_marker(len(data)).encode())
    if limit_bytes < marker_room + 2:  # no room for the marker and a byte each side: keep what fits of the head
        return data[:limit_bytes].decode("utf-8", errors="ignore")
    room = limit_bytes - marker_room
    head = data[: (room + 1) // 2].decode("utf-8", errors="ignore")
    tail = data[len(data) - room // 2 :].decode("utf-8", errors="ignore")
    cut = (
        len(data)
        - len(head.encode("utf-8", errors="surrogatepass"))
        - len(tail.encode("utf-8", errors="surrogatepass"))
    )
    return head + _marker(cut) + tail


def _marker(cut: int) -> str:
    return f"\n[... {cut:,} bytes cut from the middle ...]\n"


def _groups(messages: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """The turns as index ranges ``[start, end)``: a message with the ``tool`` messages that follow it."""
    groups: list[tuple[int, int]] = []
    for index, message in enumerate(messages):
        if message.get("role") == "tool" and groups:
            groups[-1] = (groups[-1][0], index + 1)
        else:
            groups.append((index, index + 1))
    return groups


def _stub_text(text: str, what: str) -> str:
    size = len(text.encode("utf-8", errors="surrogatepass"))
    head = text[:_STUB_KEEP].encode("utf-8", errors="surrogatepass")[:_STUB_KEEP].decode("utf-8", errors="ignore")
    return f"{head.rstrip()}\n[... {what} cut to save context: {size:,} bytes in all ...]"


def _stub_arguments(arguments: str) -> str:
    """A function call's arguments with long values stubbed, still a JSON object when they were one."""
    if len(arguments.encode("utf-8", errors="surrogatepass")) <= _STUB_OVER:
        return arguments
    try:
        parsed = load_json(arguments)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        return json.dumps({"cut": f"{len(arguments):,} characters of arguments cut to save context"})
    shortened = {
        key: _stub_text(value, "an older argument") if isinstance(value, str) and len(value) > _STUB_KEEP else value
        for key, value in parsed.items()
    }
    return json.dumps(shortened, ensure_ascii=False)


def _stub(message: dict[str, Any]) -> dict[str, Any]:
    """An older message made short; its role, ``tool_call_id`` and the ids and names of its calls kept."""
    role = message.get("role")
    content = message.get("content")
    stubbed = dict(message)
    if isinstance(content, str) and len(content.encode("utf-8", errors="surrogatepass")) > _STUB_OVER:
        what = {"tool": "an older result", "assistant": "an older reply"}.get(str(role), "an older message")
        stubbed["content"] = _stub_text(content, what)
    elif isinstance(content, list):
        stubbed["content"] = [
            {**part, "text": _stub_text(part["text"], "an older message")}
            if isinstance(part, dict) and isinstance(part.get("text"), str) and len(part["text"]) > _STUB_OVER
            else part
            for part in content
        ]
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        stubbed["tool_calls"] = [_stub_call(call) for call in calls]
    return stubbed


def _stub_call(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    return {**call, "function": {**function, "arguments": _stub_arguments(function["arguments"])}}


def _dropped_note(count: int) -> dict[str, Any]:
    return {
        "role": "user",
        "content": (
            f"[{count} earlier messages were dropped to fit the context; their edits are in the workspace "
            "and its git history.]"
        ),
    }


def compact(messages: list[dict[str, Any]], context_tokens: int, *, keep_last: int = 6) -> list[dict[str, Any]]:
    """``messages`` made to fit ``context_tokens``: unchanged while under :data:`COMPACT_AT` of it.

    Past that, older turns become stubs, oldest first, until the estimate is
    under :data:`COMPACT_TO` of the context size; if stubs are not enough,
    the oldest turns are dropped whole (one note says how many), and last the
    kept recent turns' long texts are cut in the middle. Never changed: the
    first two messages (the system prompt and the request, a stable prefix
    for prompt caching) and the pairing of an assistant's ``tool_calls``
    with the ``tool`` messages answering them. The last ``keep_last``
    messages (widened to a whole turn) stay as they are unless nothing else
    is left to shrink. The input list is not modified.
    """
    if estimate_tokens(messages) <= context_tokens * COMPACT_AT:
        return list(messages)
    target = int(context_tokens * COMPACT_TO)
    groups = _groups(messages)
    fixed = 2  # the first two messages, and any tool results that answer the second
    for start, end in groups:
        if start < 2 <= end - 1:
            fixed = end
    tail_start = max(len(messages) - max(keep_last, 0), fixed)
    for start, end in groups:  # widen the tail to the start of the turn it cuts through
        if start < tail_start < end:
            tail_start = max(start, fixed)
    out = list(messages)
    sizes = [message_tokens(m) for m in out]
    total = sum(sizes)
    for index in range(fixed, tail_start):  # 1: stubs, oldest first (earlier stubs stay as they were)
        if total <= target:
            return out
        out[index] = _stub(out[index])
        new = message_tokens(out[index])
        total += new - sizes[index]
        sizes[index] = new
    if total > target:  # 2: drop whole turns, oldest first
        droppable = [(start, end) for start, end in groups if start >= fixed and end <= tail_start]
        dropped = 0
        note = message_tokens(_dropped_note(len(messages)))
        for start, end in droppable:
            if dropped and total + note <= target:
                break
            total -= sum(sizes[start:end])
            dropped = end
        if dropped:
            count = dropped - fixed
            out = [*out[:fixed], _dropped_note(count), *out[dropped:]]
            sizes = [*sizes[:fixed], message_tokens(out[fixed]), *sizes[dropped:]]
            total = sum(sizes)
            tail_start = tail_start - count + 1
    if total > target:  # 3: cut the long texts of the recent turns, to an equal share each
        recent = range(tail_start, len(out))
        share = max((target - sum(sizes[:tail_start])) * BYTES_PER_TOKEN // max(len(recent), 1), _STUB_OVER)
        for index in recent:
            content = out[index].get("content")
            if isinstance(content, str) and len(content.encode("utf-8", errors="surrogatepass")) > share:
                out[index] = {**out[index], "content": cap_middle(content, share)}
    return out
