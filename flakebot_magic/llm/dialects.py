"""Function calls a model wrote as text (Qwen/Hermes, Llama, Mistral, bare or fenced JSON): read whole, or refused.

Servers without a tool parser (Ollama, llama.cpp, vLLM, LM Studio as often
configured) pass a model's function calls through as text. :func:`read_calls`
turns such a text into the calls it holds, in order, and names the dialect;
anything it cannot read whole (a truncated call, two dialects mixed, a call of
an unknown function, arguments that are not an object) raises
:class:`TextCallRefused`, whose message tells the model exactly which form to
use. It never returns part of a reply's calls, and never raises anything else.

The dialects (each renders with :func:`render` and reads back with
:func:`read_calls`)::

    qwen     <tool_call>{"name": "read_file", "arguments": {"path": "src/main.rs"}}</tool_call>
    llama    <function=read_file>{"path": "src/main.rs"}</function>
    json     {"name": "read_file", "parameters": {"path": "src/main.rs"}}   (bare, or in a ```json fence)
    mistral  [TOOL_CALLS] [{"name": "read_file", "arguments": {"path": "src/main.rs"}}]

Lenient JSON: the standard library first (``strict=False``: raw newlines in
strings, as models write code), then :mod:`json5` (trailing commas, single
quotes, comments) for spans up to :data:`LENIENT_LIMIT` characters. ``json5``
parses a defined grammar and never completes a truncated text. Measured
(``benchmarks/lenient_json.py``): stdlib+json5 reads 10 of 10 cases as
meant; ``json-repair`` 5 of 10 (it "repairs" a cut call into a shorter one
and reads prose as ``""``); ``dirtyjson`` 9 of 10 and is fastest, but keeps
the first of two objects silently and has had no release since 2022.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..host.fsutil import load_json

__all__ = [
    "DIALECTS",
    "LENIENT_LIMIT",
    "Dialect",
    "TextCall",
    "TextCallRefused",
    "TextCalls",
    "as_text_conversation",
    "read_calls",
    "render",
    "strict_form",
    "text_protocol",
]

Dialect = Literal["qwen", "llama", "json", "mistral"]
#: the dialects :func:`read_calls` reads and :func:`render` writes
DIALECTS: tuple[Dialect, ...] = ("qwen", "llama", "json", "mistral")
#: JSON spans longer than this are read by the standard library only (json5 is pure Python: ~60 ms per KB here)
LENIENT_LIMIT = 32 * 1024

_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"
_FUNCTION_OPEN = re.compile(r"<function=([A-Za-z_][\w.-]{0,63})>")
_FUNCTION_CLOSE = "</function>"
_MISTRAL = "[TOOL_CALLS]"
#: where a bare JSON call starts: an object whose first key is "name" (after an optional "type": "function")
_CALL_START = re.compile(r"""\{\s*(?:["']type["']\s*:\s*["']function["']\s*,\s*)?["']name["']\s*:""")
_FENCE = re.compile(r"^```[\w-]*[ \t]*\n(.*)\n[ \t]*```$", re.DOTALL)
_NEXT_CHAR = re.compile(r"\s*(\S)")
_EMPTY_FENCE = re.compile(r"```[\w-]*\s*```")
_CALL_KEYS = frozenset({"name", "arguments", "parameters", "type", "id"})
#: what, at the end of a cut reply, may be the start of a call
_OPENERS = ("{", "[", "<", "`")


class TextCallRefused(Exception):
    """A reply's text holds function calls that cannot be read whole; the message is the whole answer to the model."""

    def __init__(self, problem: str, dialect: Dialect | None, names: Sequence[str] = ()) -> None:
        self.problem = problem
        self.dialect = dialect
        super().__init__(
            f"error: {problem} Nothing from this reply was applied. Send all of its calls again, complete, "
            f"each written exactly as:\n{strict_form(dialect or 'qwen', names)}"
        )


@dataclass(frozen=True)
class TextCall:
    """One function call read from text: its name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class TextCalls:
    """The calls a reply's text holds, in order, the dialect they were written in, and the text around them."""

    calls: tuple[TextCall, ...]
    dialect: Dialect
    prose: str

    def describe(self) -> str:
        """``3 tool calls read from text, qwen dialect``."""
        n = len(self.calls)
        return f"{n} tool call{'' if n == 1 else 's'} read from text, {self.dialect} dialect"


def strict_form(dialect: Dialect, names: Sequence[str] = ()) -> str:
    """An example call in ``dialect``, as the refusal shows it (one of ``names`` when given)."""
    name = "read_file" if not names or "read_file" in names else names[0]
    example = TextCall(name, {"path": "src/main.rs"} if name == "read_file" else {})
    return render([example], dialect)


# -- rendering -------------------------------------------------------------------------------------


def render(calls: Sequence[TextCall], dialect: Dialect, *, fence: bool = False) -> str:
    """``calls`` written as a model writes them in ``dialect`` (``fence``: the json dialect in a ```json block)."""
    if dialect == "qwen":
        return "\n".join(
            f"{_HERMES_OPEN}\n{json.dumps({'name': c.name, 'arguments': c.arguments})}\n{_HERMES_CLOSE}" for c in calls
        )
    if dialect == "llama":
        return "\n".join(f"<function={c.name}>{json.dumps(c.arguments)}{_FUNCTION_CLOSE}" for c in calls)
    if dialect == "mistral":
        return f"{_MISTRAL} " + json.dumps([{"name": c.name, "arguments": c.arguments} for c in calls])
    objects = [json.dumps({"name": c.name, "parameters": c.arguments}) for c in calls]
    if fence:
        return "\n".join(f"```json\n{o}\n```" for o in objects)
    return "\n".join(objects)


# -- the text protocol (``--tool-format text``) -----------------------------------------------------------


def text_protocol(tools: Sequence[dict[str, Any]], tool_choice: dict[str, Any] | None = None) -> str:
    """The system prompt's part that describes ``tools`` (OpenAI function schemas) and the one form to call them in."""
    lines = [
        "## Calling functions",
        "This endpoint does not pass function calls through its API, so you call functions by writing them "
        "in your reply, each exactly in this form (one JSON object per call, nothing else inside the tags):",
        "",
        render([TextCall("read_file", {"path": "src/main.rs"})], "qwen"),
        "",
        "You may write several calls in one reply; they run in order and each result comes back to you. "
        "Write no other JSON outside the tags. The functions:",
    ]
    for tool in tools:
        function = tool.get("function", {})
        parameters = function.get("parameters", {})
        lines.append(
            f"- {function.get('name')}: {function.get('description', '')} "
            f"Arguments (JSON schema): {json.dumps(parameters.get('properties', {}))}; "
            f"required: {json.dumps(parameters.get('required', []))}"
        )
    chosen = (tool_choice or {}).get("function", {}).get("name")
    if chosen:
        lines.append(f"Your reply must call {chosen}.")
    return "\n".join(lines)


def as_text_conversation(
    messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]], tool_choice: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """``messages`` as a server without function calling takes them: the protocol in the system prompt,
    calls written in the qwen form, results as user messages (the conversation itself is not changed)."""
    out: list[dict[str, Any]] = []
    protocol = text_protocol(tools, tool_choice)
    names: dict[str, str] = {}
    for message in messages:
        role = message.get("role")
        if role == "system":
            out.append({"role": "system", "content": f"{message.get('content') or ''}\n\n{protocol}"})
        elif role == "assistant" and message.get("tool_calls"):
            written = []
            for call in message["tool_calls"]:
                function = call.get("function", {})
                names[str(call.get("id"))] = str(function.get("name"))
                try:
                    arguments = load_json(function.get("arguments") or "{}")
                except ValueError:
                    arguments = function.get("arguments")
                written.append(
                    f"{_HERMES_OPEN}\n{json.dumps({'name': function.get('name'), 'arguments': arguments})}\n{_HERMES_CLOSE}"
                )
            prose = message.get("content") or ""
            out.append({"role": "assistant", "content": "\n".join([prose, *written]).strip()})
        elif role == "tool":
            name = names.get(str(message.get("tool_call_id")), "the function")
            out.append({"role": "user", "content": f"Result of {name}:\n{message.get('content') or ''}"})
        else:
            out.append(dict(message))
    if not any(m.get("role") == "system" for m in out):
        out.insert(0, {"role": "system", "content": protocol})
    return out


# -- reading ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Span:
    start: int
    end: int
    dialect: Dialect
    calls: tuple[TextCall, ...]


def read_calls(text: str, names: Collection[str], *, truncated: bool = False) -> TextCalls | None:
    """The function calls written in ``text``, or None when it holds none.

    Parameters
    ----------
    text
        The reply's content.
    names
        The functions the model may call; a call of any other refuses the reply.
    truncated
        The reply was cut off (``finish_reason: "length"``): any call in it,
        or anything that may start one, refuses it whole (what was cut
        cannot be known).

    Raises
    ------
    TextCallRefused
        The text holds a call that cannot be read whole, or calls in two dialects.

    Examples
    --------
    >>> read_calls('<function=run_checks>{}</function>', ["run_checks"]).describe()
    '1 tool call read from text, llama dialect'
    """
    try:
        return _read(text, tuple(names), truncated)
    except TextCallRefused:
        raise
    except (RecursionError, ValueError, TypeError) as exc:  # a parser's limit on hostile nesting
        raise TextCallRefused(f"the calls in your reply could not be read ({type(exc).__name__}).", None) from None


def _read(text: str, names: tuple[str, ...], truncated: bool) -> TextCalls | None:
    spans = _tagged(text, names)
    dialects = {s.dialect for s in spans}
    if len(dialects) > 1:
        raise TextCallRefused(
            f"your reply mixes two forms of function call ({' and '.join(sorted(dialects))}).", None, names
        )
    rest = _blank(text, spans)
    bare = _bare(rest, names)
    if bare and spans:
        raise TextCallRefused(
            f"your reply mixes two forms of function call ({spans[0].dialect} and bare JSON).", None, names
        )
    spans = spans or bare
    if truncated and (spans or any(opener in text for opener in _OPENERS)):
        raise TextCallRefused(
            "your reply was cut off at the token limit, so its calls may be incomplete; "
            "send fewer or smaller calls (replace_in_file rather than write_file of a long file).",
            spans[0].dialect if spans else None,
            names,
        )
    if not spans:
        return None
    calls = tuple(call for span in spans for call in span.calls)
    if not calls:
        raise TextCallRefused(f"your {spans[0].dialect} call list is empty.", spans[0].dialect, names)
    prose = _EMPTY_FENCE.sub("", _blank(text, spans)).strip()
    return TextCalls(calls, spans[0].dialect, re.sub(r"\s{3,}", "\n\n", prose))


def _blank(text: str, spans: Sequence[_Span]) -> str:
    """``text`` with ``spans`` replaced by spaces (positions kept)."""
    out = list(text)
    for span in spans:
        out[span.start : span.end] = " " * (span.end - span.start)
    return "".join(out)


def _tagged(text: str, names: tuple[str, ...]) -> list[_Span]:
    """The calls in tags (qwen, llama, mistral), in order; a tag left open refuses the reply."""
    spans: list[_Span] = []
    tags = _Tags(text)
    at = 0
    while True:
        found = tags.next(at)
        if found is None:
            break
        start, dialect, match = found
        if dialect == "qwen":
            close = text.find(_HERMES_CLOSE, start)
            if close < 0:
                raise TextCallRefused(f"a {_HERMES_OPEN} is not closed by {_HERMES_CLOSE}.", "qwen", names)
            inner = text[start + len(_HERMES_OPEN) : close]
            if _HERMES_OPEN in inner:
                raise TextCallRefused(f"a {_HERMES_OPEN} opens inside another.", "qwen", names)
            end = close + len(_HERMES_CLOSE)
            value = _loads(_unfenced(inner), "qwen", names)
            items = value if isinstance(value, list) else [value]
            calls = tuple(_call(item, "qwen", names) for item in items)
        elif dialect == "llama":
            assert match is not None
            close = text.find(_FUNCTION_CLOSE, match.end())
            if close < 0:
                raise TextCallRefused(
                    f"a <function={match.group(1)}> is not closed by {_FUNCTION_CLOSE}.", "llama", names
                )
            inner = text[match.end() : close]
            end = close + len(_FUNCTION_CLOSE)
            arguments = _loads(_unfenced(inner), "llama", names) if inner.strip() else {}
            calls = (_call({"name": match.group(1), "arguments": arguments}, "llama", names),)
        else:
            body = start + len(_MISTRAL)
            while body < len(text) and text[body].isspace():
                body += 1
            if not text.startswith("[", body):
                raise TextCallRefused(f"{_MISTRAL} is not followed by a JSON list of calls.", "mistral", names)
            close_at = _balanced(text, body)
            if close_at is None:
                raise TextCallRefused(f"the list after {_MISTRAL} is not closed.", "mistral", names)
            end = close_at
            value = _loads(text[body:end], "mistral", names)
            items = value if isinstance(value, list) else [value]
            calls = tuple(_call(item, "mistral", names) for item in items)
        spans.append(_Span(start, end, dialect, calls))
        at = end
    stray = _blank(text, spans)
    if "<function=" in stray:
        raise TextCallRefused("a <function=...> tag does not name a function.", "llama", names)
    for closer, dialect in ((_HERMES_CLOSE, "qwen"), (_FUNCTION_CLOSE, "llama")):
        if closer in stray:
            raise TextCallRefused(f"a {closer} closes no call.", dialect, names)
    return spans


class _Tags:
    """The next opening tag of each dialect from a position on; each kind is searched again only once passed."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.found: dict[Dialect, tuple[int, re.Match[str] | None]] = {}

    def next(self, at: int) -> tuple[int, Dialect, re.Match[str] | None] | None:
        for dialect in ("qwen", "llama", "mistral"):
            known = self.found.get(dialect)
            if known is None or 0 <= known[0] < at:
                self.found[dialect] = self._search(dialect, at)
        live = [(start, dialect, match) for dialect, (start, match) in self.found.items() if start >= 0]
        return min(live, key=lambda f: f[0]) if live else None

    def _search(self, dialect: Dialect, at: int) -> tuple[int, re.Match[str] | None]:
        if dialect == "llama":
            match = _FUNCTION_OPEN.search(self.text, at)
            return (match.start(), match) if match is not None else (-1, None)
        return self.text.find(_HERMES_OPEN if dialect == "qwen" else _MISTRAL, at), None


def _bare(text: str, names: tuple[str, ...]) -> list[_Span]:
    """Bare JSON calls (an object whose first key is ``name``), or lists of them, in order.

    Each character is scanned about once: a closed object that is not a call
    is skipped whole, and an object or list of calls left open refuses the
    reply, so a hostile reply costs linear time.
    """
    spans: list[_Span] = []
    at = 0
    while True:
        match = _CALL_START.search(text, at)
        if match is None:
            return spans
        start = match.start()
        end = _balanced(text, start)
        if end is None:
            raise TextCallRefused("a JSON call is not closed (cut off?).", "json", names)
        opener = _list_before(text, start)
        after = _NEXT_CHAR.match(text, end)
        if (
            opener is not None and after is not None and after.group(1) in ",]"
        ):  # a list of calls `[{"name": ...}, ...]` is read whole
            list_end = _balanced(text, opener)
            if list_end is None:
                raise TextCallRefused("a JSON list of calls is not closed (cut off?).", "json", names)
            value = _loads(text[opener:list_end], "json", names)
            items = value if isinstance(value, list) else [value]
            spans.append(_Span(opener, list_end, "json", tuple(_call(item, "json", names) for item in items)))
            at = list_end
            continue
        value = _loads(text[start:end], "json", names)
        if _looks_like_call(value, names):
            spans.append(_Span(start, end, "json", (_call(value, "json", names),)))
        elif isinstance(value, dict) and value.get("name") in names:
            _call(value, "json", names)  # a known function's call gone wrong: says what is wrong with it
        at = end


def _list_before(text: str, start: int) -> int | None:
    """The position of a ``[`` right before ``start`` (whitespace between), else None."""
    i = start - 1
    while i >= 0 and text[i].isspace():
        i -= 1
    return i if i >= 0 and text[i] == "[" else None


def _looks_like_call(item: object, names: tuple[str, ...]) -> bool:
    """A JSON object shaped as a call: a name, arguments or parameters (unless the name is known), no other key."""
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return False
    if not set(item) <= _CALL_KEYS or item.get("type", "function") != "function":
        return False
    return "arguments" in item or "parameters" in item or item["name"] in names


def _call(item: object, dialect: Dialect, names: tuple[str, ...]) -> TextCall:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise TextCallRefused('a call is not an object with a "name".', dialect, names)
    name = item["name"]
    extra = sorted(set(item) - _CALL_KEYS)
    if extra:
        raise TextCallRefused(f"the call of {name!r} has unknown keys {', '.join(map(repr, extra))}.", dialect, names)
    if "arguments" in item and "parameters" in item:
        raise TextCallRefused(f'the call of {name!r} has both "arguments" and "parameters".', dialect, names)
    if name not in names:
        raise TextCallRefused(
            f"there is no function named {name!r}; the functions are {', '.join(names)}.", dialect, names
        )
    arguments = item.get("arguments", item.get("parameters", {}))
    if isinstance(arguments, str):  # arguments as a JSON string inside JSON
        arguments = _loads(arguments, dialect, names) if arguments.strip() else {}
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise TextCallRefused(f"the arguments of {name} are not a JSON object.", dialect, names)
    return TextCall(name, arguments)


def _unfenced(inner: str) -> str:
    stripped = inner.strip()
    match = _FENCE.match(stripped)
    return match.group(1) if match else stripped


def _loads(span: str, dialect: Dialect, names: Sequence[str]) -> Any:
    """A JSON value: strict (raw control characters allowed), else JSON5 for short spans; else a refusal."""
    try:
        return load_json(span, strict=False)
    except ValueError:
        pass
    if len(span) <= LENIENT_LIMIT:
        import json5  # lazy: only replies that need it

        try:
            return json5.loads(span)
        except (ValueError, TypeError, RecursionError, IndexError):
            pass
        reason = "is not valid JSON (nor JSON5)"
    else:
        reason = f"is not strict JSON (longer than {LENIENT_LIMIT // 1024} KB, so no lenient reading is tried)"
    raise TextCallRefused(f"a call's JSON {reason}: {span[:80]!r}...", dialect, names)


def _balanced(text: str, start: int) -> int | None:
    """The end of the JSON object or list opening at ``start`` (strings skipped), or None when it is not closed."""
    stack: list[str] = []
    quote = ""
    i = start
    pairs = {"{": "}", "[": "]"}
    n = len(text)
    while i < n:
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 2
                continue
            if ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in pairs:
            stack.append(pairs[ch])
        elif ch in "}]":
            if not stack or stack.pop() != ch:
                return None
            if not stack:
                return i + 1
        i += 1
    return None
