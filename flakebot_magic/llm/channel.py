"""Requests to the model: replies read within byte and time caps, unusable ones discarded whole and asked again.

A reply (streamed or not) is stopped past ``max_reply_bytes`` or
``max_reply_seconds`` and counts as unusable, as does a broken stream, a body
that is not JSON, or an empty reply; nothing from an unusable reply is ever
applied. After :data:`MAX_STREAM_RETRIES` retries the session ends with
:class:`~flakebot_magic.errors.ModelError`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ..errors import ModelError
from ..events import EventBus
from .http import ModelHTTP
from .model import ModelConfig
from .usage import Usage

__all__ = [
    "MAX_REPLY_BYTES",
    "MAX_REPLY_SECONDS",
    "MAX_STREAM_RETRIES",
    "BrokenReply",
    "ModelChannel",
    "Reply",
]

MAX_STREAM_RETRIES = 3
#: a model reply (streamed or not) is stopped past this many bytes or seconds and counts as unusable
MAX_REPLY_BYTES = 4 * 1024 * 1024
MAX_REPLY_SECONDS = 300.0


@dataclass
class Reply:
    """One whole reply of the model: its text, its function calls (OpenAI's ``tool_calls`` shape), the tokens it cost.

    ``usage``: its tokens as the API reported them; ``estimated`` is True when it reported none and
    ``tokens`` (and ``usage``) were estimated from the text.
    """

    content: str
    calls: list[dict[str, Any]]
    tokens: int
    usage: Usage = field(default_factory=Usage)
    estimated: bool = False


def _reported(usage: Any) -> Usage | None:
    """One reply's ``usage`` as the API reported it (:meth:`Usage.of_reply`), or None when it reported none."""
    reply = Usage.of_reply(usage) if usage is not None else None
    return reply if reply is not None and reply.tokens else None


class BrokenReply(Exception):
    """A reply that cannot be used as is (broken stream, bad JSON, empty, past a cap); ask again."""


class ModelChannel:
    """Sends the conversation to the model and reads its replies; counts the calls and tokens.

    Parameters
    ----------
    client
        An ``openai.OpenAI`` (or anything with ``chat.completions.create``).
    model
        The model configuration (its name is sent; ``stream`` is honoured).
    bus
        Receives a notice for each unusable reply.
    workspace
        Named in the errors raised.
    """

    def __init__(
        self,
        client: Any,
        model: ModelConfig,
        *,
        bus: EventBus,
        workspace: Path,
        max_reply_bytes: int = MAX_REPLY_BYTES,
        max_reply_seconds: float = MAX_REPLY_SECONDS,
        headers: dict[str, str] | None = None,
        sampling: dict[str, Any] | None = None,
        http: ModelHTTP | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> None:
        self.client = client
        #: the functions the model may call (the edit protocol's, for an engineer)
        self.tools = list(tools or [])
        #: sent with every request (``X-Flakebot-Role``, ``X-Flakebot-Candidate``)
        self.headers = dict(headers or {})
        #: ``temperature``, ``seed``: what makes one candidate differ from another
        self.sampling = dict(sampling or {})
        self.http = http
        #: prompt, completion and cached tokens of the replies so far
        self.spent = Usage()
        self.model = model
        self.bus = bus
        self.workspace = workspace
        self.max_reply_bytes = max_reply_bytes
        self.max_reply_seconds = max_reply_seconds
        self.tokens = 0
        self.calls = 0

    def complete(self, messages: list[dict[str, Any]], *, check_budget: Callable[[], None]) -> Reply:
        """The model's next usable reply; ``check_budget`` runs (and may raise) before each request."""
        problem = ""
        for _ in range(MAX_STREAM_RETRIES + 1):
            check_budget()
            if self.http is not None:
                self.http.check()
            self.calls += 1
            try:
                return self._request(messages)
            except BrokenReply as exc:
                problem = str(exc)
                self.bus.notice(
                    "edit", f"the model's reply was unusable ({problem}); nothing was applied, asking again", "warning"
                )
        raise ModelError(
            f"The model {self.model.describe()} sent {MAX_STREAM_RETRIES + 1} unusable replies in a row "
            f"(the last: {problem}). Nothing from them was applied. Try again, or another model.",
            workspace=self.workspace,
        )

    def _request(self, messages: list[dict[str, Any]]) -> Reply:
        import openai  # lazy: importing flakebot_magic stays cheap

        prompt_estimate = sum(len(json.dumps(m)) for m in messages) // 4
        kwargs: dict[str, Any] = {
            "model": self.model.model,
            "messages": messages,
            **({"tools": self.tools} if self.tools else {}),
            **self.sampling,
        }
        if self.headers:
            kwargs["extra_headers"] = self.headers
        deadline = time.monotonic() + self.max_reply_seconds
        try:
            if self.model.stream:
                stream = self.client.chat.completions.create(
                    **kwargs, stream=True, stream_options={"include_usage": True}
                )
                return self._read_stream(stream, prompt_estimate, deadline)
            raw = getattr(self.client.chat.completions, "with_streaming_response", None)
            if raw is not None:  # read the body in bounded pieces, not whole
                with raw.create(**kwargs) as http:
                    return self._read_body(http.iter_bytes(), prompt_estimate, deadline)
            response = self.client.chat.completions.create(**kwargs)
        except openai.APIStatusError as exc:
            raise ModelError(
                f"The model endpoint {self.model.base_url} answered HTTP {exc.status_code} "
                f"(after the SDK's retries): {str(exc)[:300]}. Check --model, --base-url and the key.",
                status=exc.status_code,
                workspace=self.workspace,
            ) from exc
        except openai.APIConnectionError as exc:
            raise ModelError(
                f"Cannot reach the model endpoint {self.model.base_url} (after the SDK's retries): {exc}.",
                workspace=self.workspace,
            ) from exc
        except ValueError as exc:  # a body that is not JSON
            raise BrokenReply(f"malformed response: {exc}") from exc
        except httpx.HTTPError as exc:  # the body broke off mid-way (the SDK retries only the request)
            raise BrokenReply(f"the reply broke mid-way: {type(exc).__name__}: {str(exc)[:200]}") from exc
        if not response.choices:
            raise BrokenReply("a reply without choices")
        message = response.choices[0].message
        calls = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": c.function.arguments or ""},
            }
            for c in message.tool_calls or []
        ]
        usage = _reported(response.usage)
        tokens = usage.tokens if usage else prompt_estimate + len(message.content or "") // 4
        return self._accept(message.content or "", calls, tokens, usage, prompt_estimate)

    def _read_body(self, pieces: Iterable[bytes], prompt_estimate: int, deadline: float) -> Reply:
        """A non-streamed reply, read in pieces within the byte and time caps; parsed as plain JSON."""
        body = bytearray()
        for piece in pieces:
            body += piece
            self._within_caps(len(body), deadline)
        try:
            data = json.loads(bytes(body))
            message = data["choices"][0]["message"] if data.get("choices") else None
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
            raise BrokenReply(f"malformed response: {type(exc).__name__}: {str(exc)[:200]}") from exc
        if not isinstance(message, dict):
            raise BrokenReply("a reply without choices")
        calls: list[dict[str, Any]] = []
        for c in message.get("tool_calls") or []:
            function = c.get("function") if isinstance(c, dict) else None
            if not isinstance(function, dict):
                continue
            calls.append(
                {
                    "id": str(c.get("id") or f"call_{len(calls)}"),
                    "type": "function",
                    "function": {
                        "name": str(function.get("name") or ""),
                        "arguments": str(function.get("arguments") or ""),
                    },
                }
            )
        text = message.get("content")
        content = text if isinstance(text, str) else ""
        usage = _reported(data.get("usage") if isinstance(data.get("usage"), dict) else None)
        tokens = usage.tokens if usage else prompt_estimate + len(content) // 4
        return self._accept(content, calls, tokens, usage, prompt_estimate)

    def _within_caps(self, size: int, deadline: float) -> None:
        """Stop a reply past ``max_reply_bytes`` or its time limit."""
        if size > self.max_reply_bytes:
            raise BrokenReply(
                f"the reply passed {self.max_reply_bytes:,} bytes and was stopped (a runaway or hostile endpoint?)"
            )
        if time.monotonic() > deadline:
            raise BrokenReply(f"the reply took longer than {self.max_reply_seconds:g} s and was stopped")

    def _read_stream(self, stream: Any, prompt_estimate: int, deadline: float) -> Reply:
        import openai  # lazy: importing flakebot_magic stays cheap

        content: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        usage: Usage | None = None
        finished = False
        size = 0
        try:
            for chunk in stream:
                # bytes received so far (httpx counts them), else what the reply holds (text, function calls)
                for choice in chunk.choices or []:
                    delta = choice.delta
                    size += len((delta.content or "").encode())
                    for piece in delta.tool_calls or []:
                        if piece.function is not None:
                            size += len((piece.function.name or "") + (piece.function.arguments or ""))
                received = getattr(getattr(stream, "response", None), "num_bytes_downloaded", None)
                self._within_caps(max(size, received if isinstance(received, int) else 0), deadline)
                if getattr(chunk, "usage", None):
                    usage = _reported(chunk.usage) or usage
                for choice in chunk.choices or []:
                    delta = choice.delta
                    if delta.content:
                        content.append(delta.content)
                    for piece in delta.tool_calls or []:
                        entry = calls.setdefault(piece.index, {"id": "", "name": "", "arguments": []})
                        if piece.id:
                            entry["id"] = piece.id
                        if piece.function is not None:
                            if piece.function.name:
                                entry["name"] += piece.function.name
                            if piece.function.arguments:
                                entry["arguments"].append(piece.function.arguments)
                    if choice.finish_reason:
                        finished = True
        except (openai.APIError, ValueError, OSError, httpx.HTTPError) as exc:
            raise BrokenReply(f"the stream broke mid-way: {type(exc).__name__}: {str(exc)[:200]}") from exc
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
        if not finished:
            raise BrokenReply("the stream ended before the reply did")
        text = "".join(content)
        function_calls: list[dict[str, Any]] = [
            {
                "id": entry["id"] or f"call_{index}",
                "type": "function",
                "function": {"name": entry["name"], "arguments": "".join(entry["arguments"])},
            }
            for index, entry in sorted(calls.items())
        ]
        arguments = sum(len(c["function"]["arguments"]) for c in function_calls)
        tokens = usage.tokens if usage else prompt_estimate + (len(text) + arguments) // 4
        return self._accept(text, function_calls, tokens, usage, prompt_estimate)

    def _accept(
        self,
        content: str,
        calls: list[dict[str, Any]],
        tokens: int,
        usage: Usage | None = None,
        prompt_estimate: int = 0,
    ) -> Reply:
        reply = usage or Usage(prompt_estimate, max(0, tokens - prompt_estimate), 0, 1)
        self.tokens += tokens
        self.spent = self.spent + reply
        if not content.strip() and not calls:
            raise BrokenReply("an empty reply")
        return Reply(content, calls, tokens, reply, estimated=usage is None)
