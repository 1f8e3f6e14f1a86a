"""One model reply, read within its caps: streamed or whole, its text, function calls and usage, or unusable.

A reply is stopped past :attr:`~flakebot_magic.llm.limits.ReplyLimits.max_bytes`
or :attr:`~flakebot_magic.llm.limits.ReplyLimits.max_seconds` and counts as
unusable (:class:`BrokenReply`), as does a broken stream, a body that is not
JSON, or an empty reply. The endpoint is not trusted: nothing of an unusable
reply is ever used, and a count it reports that is not a plausible number of
tokens counts as missing (then the tokens are estimated from the text).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..host.fsutil import load_json
from .limits import ReplyLimits
from .usage import Usage

__all__ = ["BrokenReply", "Reply", "ReplyReader", "function_call"]


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
    #: why the reply ended, as the endpoint said (``stop``, ``tool_calls``, ``length``: cut at the token limit)
    finish_reason: str = ""
    #: the dialect the calls were read from when the model wrote them as text (:mod:`.dialects`), else None
    dialect: str | None = None
    #: when the text held calls that could not be read whole: the whole answer to the model (no call runs)
    refusal: str = ""


class BrokenReply(Exception):
    """A reply that cannot be used as is (broken stream, bad JSON, empty, past a cap); ask again."""

    def __init__(self, problem: str, usage: Usage | None = None) -> None:
        super().__init__(problem)
        #: what the reply cost when it was read to its end (an empty reply), else None
        self.usage = usage


def _reported(usage: Any) -> Usage | None:
    """One reply's ``usage`` as the API reported it (:meth:`Usage.of_reply`), or None when it reported none."""
    reply = Usage.of_reply(usage) if usage is not None else None
    return reply if reply is not None and reply.tokens else None


class ReplyReader:
    """Reads one reply within ``limits``, from the moment its request was sent; ``prompt_estimate`` fills a missing count."""

    def __init__(self, limits: ReplyLimits, prompt_estimate: int) -> None:
        self.limits = limits
        self.prompt_estimate = prompt_estimate
        self.deadline = time.monotonic() + limits.max_seconds

    def within_caps(self, size: int) -> None:
        """Stop a reply past the byte cap or its time limit."""
        if size > self.limits.max_bytes:
            raise BrokenReply(
                f"the reply passed {self.limits.max_bytes:,} bytes and was stopped (a runaway or hostile endpoint?)"
            )
        if time.monotonic() > self.deadline:
            raise BrokenReply(f"the reply took longer than {self.limits.max_seconds:g} s and was stopped")

    def body(self, pieces: Iterable[bytes]) -> Reply:
        """A non-streamed reply, read in pieces within the caps; parsed as plain JSON."""
        body = bytearray()
        for piece in pieces:
            body += piece
            self.within_caps(len(body))
        try:
            data = load_json(bytes(body))
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
                function_call(str(c.get("id") or f"call_{len(calls)}"), function.get("name"), function.get("arguments"))
            )
        text = message.get("content")
        content = text if isinstance(text, str) else ""
        finish = data["choices"][0].get("finish_reason") if isinstance(data["choices"][0], dict) else None
        return self._whole(
            content,
            calls,
            _reported(data.get("usage") if isinstance(data.get("usage"), dict) else None),
            str(finish or ""),
        )

    def stream(self, stream: Any) -> Reply:
        """A streamed reply, read chunk by chunk within the caps; the stream is closed however it ends."""
        import openai  # lazy: importing flakebot_magic stays cheap

        content: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        usage: Usage | None = None
        finished = ""
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
                self.within_caps(max(size, received if isinstance(received, int) else 0))
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
                        finished = str(choice.finish_reason)
        except (openai.APIError, ValueError, OSError, httpx.HTTPError) as exc:
            raise BrokenReply(f"the stream broke mid-way: {type(exc).__name__}: {str(exc)[:200]}") from exc
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
        if not finished:
            raise BrokenReply("the stream ended before the reply did")
        function_calls = [
            function_call(entry["id"] or f"call_{index}", entry["name"], "".join(entry["arguments"]))
            for index, entry in sorted(calls.items())
        ]
        return self._whole("".join(content), function_calls, usage, finished)

    def _whole(self, content: str, calls: list[dict[str, Any]], usage: Usage | None, finish: str = "") -> Reply:
        """The reply read to its end: its usage (estimated when not reported); an empty one is unusable."""
        arguments = sum(len(c["function"]["arguments"]) for c in calls)
        tokens = usage.tokens if usage else self.prompt_estimate + (len(content) + arguments) // 4
        spent = usage or Usage(self.prompt_estimate, max(0, tokens - self.prompt_estimate), 0, 1)
        if not content.strip() and not calls:
            raise BrokenReply("an empty reply", spent)
        return Reply(content, calls, tokens, spent, estimated=usage is None, finish_reason=finish)


def function_call(ident: str, name: Any, arguments: Any) -> dict[str, Any]:
    """One function call in OpenAI's ``tool_calls`` shape (its name and arguments as text)."""
    return {"id": ident, "type": "function", "function": {"name": str(name or ""), "arguments": str(arguments or "")}}
