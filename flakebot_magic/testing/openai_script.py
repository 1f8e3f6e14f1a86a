"""The script a fake-openai server replays: its queues of items (assistant messages and faults), checked and routed."""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

__all__ = [
    "CANDIDATE_HEADER",
    "DEFAULT_QUEUE",
    "FAULTS",
    "FINISH_REASONS",
    "ROLE_HEADER",
    "Item",
    "LoadedScript",
    "Queue",
    "Script",
    "Taken",
    "load_script",
]

#: the faults a script item may name
FAULTS = ("status", "reset", "malformed", "stall", "flood")
#: the finish reasons a scripted reply may give
FINISH_REASONS = ("stop", "length", "tool_calls", "content_filter")
#: the request headers that route a request to a candidate's or a role's queue
CANDIDATE_HEADER = "x-flakebot-candidate"
ROLE_HEADER = "x-flakebot-role"
#: the name of the queue that answers every request no other queue claims
DEFAULT_QUEUE = "responses"
_TOP_KEYS = ("responses", "roles", "candidates", "delay")
_QUEUE_KEYS = ("responses", "delay")
_USAGE_KEYS = (
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "prompt_tokens_details",
    "completion_tokens_details",
)
_PLACEHOLDER = {"role": "assistant", "content": "partial reply from the scripted test double"}

Script = Union[Mapping[str, Any], Sequence[Mapping[str, Any]], "os.PathLike[str]", str]


@dataclass(frozen=True)
class Item:
    """One script item: ``body`` is the wire message (or the fault), with its own delay and usage if scripted."""

    body: dict[str, Any]
    delay: float | None = None
    usage: dict[str, Any] | None = None
    #: the ``finish_reason`` scripted for this reply (``length``: cut at the token limit), else the usual one
    finish: str | None = None

    @property
    def fault(self) -> str | None:
        """The fault this item names, or None for an assistant message."""
        fault = self.body.get("fault")
        return str(fault) if fault is not None else None


@dataclass(frozen=True)
class Taken:
    """What one request took from its queue.

    ``number`` counts the requests this queue has received (1 for its first);
    ``item`` is None when the queue ran out; ``wait`` is the seconds to wait
    before answering (stalls plus the item's delay).
    """

    queue: str
    number: int
    size: int
    item: Item | None
    wait: float


class Queue:
    """One named queue of items, consumed in order (thread-safe) by the requests routed to it."""

    def __init__(self, name: str, items: list[Item], delay: float) -> None:
        self.name = name
        self.items = items
        self.delay = delay  # the queue's own "delay", else the script's
        self._cursor = 0
        self._asked = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.items)

    @property
    def remaining(self) -> int:
        """How many items have not been consumed yet."""
        with self._lock:
            return len(self.items) - self._cursor

    def take(self) -> Taken:
        """Consume the next item (and any stalls before it)."""
        with self._lock:
            self._asked += 1
            wait = 0.0
            item = self._pop()
            while item is not None and item.fault == "stall":
                wait += float(item.body["seconds"])
                item = self._pop()
            if item is not None:
                wait += item.delay if item.delay is not None else self.delay
            return Taken(self.name, self._asked, len(self.items), item, wait)

    def _pop(self) -> Item | None:
        if self._cursor >= len(self.items):
            return None
        self._cursor += 1
        return self.items[self._cursor - 1]


class LoadedScript:
    """A checked script: the default queue and the per-role and per-candidate queues."""

    def __init__(self, queues: dict[str, Queue]) -> None:
        self.queues = queues

    def __len__(self) -> int:
        return sum(len(queue) for queue in self.queues.values())

    @property
    def remaining(self) -> int:
        """How many items, over all queues, have not been consumed yet."""
        return sum(queue.remaining for queue in self.queues.values())

    def route(self, headers: Mapping[str, str]) -> Queue | None:
        """The queue for a request with these (lower-cased) headers, or None when no queue claims it.

        The candidate's queue if the script has one, else the role's, else
        the default ``responses`` queue.
        """
        candidate = (headers.get(CANDIDATE_HEADER) or "").strip()
        if candidate.isdigit():
            candidate = str(int(candidate))
        role = (headers.get(ROLE_HEADER) or "").strip()
        for name in (f"candidates.{candidate}" if candidate else "", f"roles.{role}" if role else "", DEFAULT_QUEUE):
            if name in self.queues:
                return self.queues[name]
        return None


def load_script(script: Script) -> LoadedScript:
    """Read and check a script; return its queues, normalised.

    Parameters
    ----------
    script
        ``{"responses": [...]}``, the bare list, a routed script
        ``{"roles": {ROLE: QUEUE}, "candidates": {"0": QUEUE}, "responses":
        [...], "delay": S}`` (a QUEUE is ``{"responses": [...], "delay": S}``
        or the bare list), or the path of a JSON file holding any of these.

    Raises
    ------
    ValueError
        A part of the script has the wrong shape; the message names the
        place (``roles.architect item 2``, ``candidates``, ...).
    """
    if isinstance(script, (str, os.PathLike)):
        script = json.loads(Path(script).read_text(encoding="utf-8"))
    if not isinstance(script, Mapping):
        return LoadedScript({DEFAULT_QUEUE: _queue(DEFAULT_QUEUE, script, 0.0)})
    unknown = sorted(str(key) for key in script if key not in _TOP_KEYS)
    if unknown:
        raise ValueError(f"fake-openai script: unknown key(s) {', '.join(unknown)}; use {', '.join(_TOP_KEYS)}")
    if not any(key in script for key in ("responses", "roles", "candidates")):
        raise ValueError('a fake-openai script must be {"responses": [...]}, a list, or have "roles"/"candidates"')
    delay = _delay("fake-openai script", script.get("delay", 0.0))
    queues: dict[str, Queue] = {}
    if "responses" in script:
        queues[DEFAULT_QUEUE] = _queue(DEFAULT_QUEUE, script["responses"], delay)
    for group in ("roles", "candidates"):
        table = script.get(group, {})
        if not isinstance(table, Mapping):
            raise ValueError(f'fake-openai script: "{group}" must be an object of queues, not {type(table).__name__}')
        for key, value in table.items():
            name = f"{group}.{_queue_key(group, key)}"
            if name in queues:
                raise ValueError(f"fake-openai script: {name} is given twice")
            if isinstance(value, Mapping):
                extra = sorted(str(k) for k in value if k not in _QUEUE_KEYS)
                if extra or "responses" not in value:
                    raise ValueError(f'fake-openai script {name} must be {{"responses": [...], "delay": S}} or a list')
                queues[name] = _queue(
                    name, value["responses"], _delay(f"fake-openai script {name}", value.get("delay", delay))
                )
            else:
                queues[name] = _queue(name, value, delay)
    return LoadedScript(queues)


def _queue_key(group: str, key: object) -> str:
    if group == "candidates":
        if isinstance(key, int) and not isinstance(key, bool) and key >= 0:
            return str(key)
        if isinstance(key, str) and key.strip().isdigit():
            return str(int(key))
        raise ValueError(f"fake-openai script candidates: {key!r} is not a candidate index (0, 1, ...)")
    if not isinstance(key, str) or not key.strip() or key != key.strip():
        raise ValueError(f"fake-openai script roles: {key!r} is not a role name (like architect or engineer)")
    return key


def _delay(where: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f'{where}: "delay" must be a number of seconds >= 0, not {value!r}')
    return float(value)


def _queue(name: str, items: object, delay: float) -> Queue:
    where = "fake-openai script" if name == DEFAULT_QUEUE else f"fake-openai script {name}"
    if not isinstance(items, Sequence) or isinstance(items, (str, bytes)):
        raise ValueError(f"{where}: the responses must be a list")
    return Queue(name, [_check_item(f"{where} item {index}", item) for index, item in enumerate(items)], delay)


def _check_item(where: str, item: object) -> Item:
    if not isinstance(item, Mapping):
        raise ValueError(f"{where} must be an object, not {type(item).__name__}")
    item = dict(item)
    delay = _delay(where, item["delay"]) if "delay" in item else None
    if "fault" in item:
        fault = item["fault"]
        if fault not in FAULTS:
            raise ValueError(f"{where}: unknown fault {fault!r}; use one of {', '.join(FAULTS)}")
        if "usage" in item:
            raise ValueError(f'{where}: only an assistant message has a "usage", not a {fault!r} fault')
        if fault == "status" and not (isinstance(item.get("status"), int) and 400 <= item["status"] <= 599):
            raise ValueError(f'{where}: a "status" fault needs "status": an HTTP error code 400-599')
        if fault == "stall":
            if not (isinstance(item.get("seconds"), (int, float)) and item["seconds"] >= 0):
                raise ValueError(f'{where}: a "stall" fault needs "seconds": a number >= 0')
            if delay is not None:
                raise ValueError(f'{where}: a "stall" waits "seconds" already; put the "delay" on the item after it')
        if fault == "reset":
            after = item.get("after_chunks", 0)
            if not isinstance(after, int) or after < 0:
                raise ValueError(f'{where}: "after_chunks" must be an integer >= 0')
            item["message"] = _check_message(where, item.get("message", _PLACEHOLDER))
        return Item(item, delay)
    usage = _check_usage(where, item["usage"]) if "usage" in item else None
    finish = item.pop("finish_reason", None)
    if finish is not None and finish not in FINISH_REASONS:
        raise ValueError(f'{where}: "finish_reason" must be one of {", ".join(FINISH_REASONS)}, not {finish!r}')
    return Item(_check_message(where, _written_as_text(where, item)), delay, usage, finish)


def _written_as_text(where: str, item: dict[str, Any]) -> dict[str, Any]:
    """An item with ``"dialect"``: its ``tool_calls`` written into its content as a model of that dialect writes them.

    ``"content"`` is the prose before the calls, ``"after"`` the prose after
    them, ``"fence"``: the json dialect in ```json blocks, ``"cut"``: the text
    cut to that many characters (a reply stopped mid-call).
    """
    from ..llm.dialects import DIALECTS, TextCall, render

    if "dialect" not in item:
        extra = sorted(key for key in ("after", "fence", "cut") if key in item)
        if extra:
            raise ValueError(f'{where}: {", ".join(extra)} only go with "dialect"')
        return item
    dialect = item.pop("dialect")
    if dialect not in DIALECTS:
        raise ValueError(f'{where}: unknown "dialect" {dialect!r}; use one of {", ".join(DIALECTS)}')
    calls = []
    for number, call in enumerate(item.pop("tool_calls", None) or []):
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ValueError(f'{where}: tool call {number} needs "function": {{"name": ...}}')
        arguments = function.get("arguments", {})
        calls.append(TextCall(function["name"], json.loads(arguments) if isinstance(arguments, str) else arguments))
    text = render(calls, dialect, fence=bool(item.pop("fence", False)))
    text = "\n".join(part for part in (item.get("content") or "", text, str(item.pop("after", ""))) if part)
    cut = item.pop("cut", None)
    if cut is not None:
        if isinstance(cut, bool) or not isinstance(cut, int) or not 0 < cut < len(text):
            raise ValueError(f'{where}: "cut" must be a number of characters within the text (1..{len(text) - 1})')
        text = text[:cut]
    return {**item, "content": text}


def _count(where: str, name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f'{where}: "usage" needs "{name}": an integer >= 0, not {value!r}')
    return value


def _check_usage(where: str, usage: object) -> dict[str, Any]:
    if not isinstance(usage, Mapping):
        raise ValueError(f'{where}: "usage" must be an object like {{"prompt_tokens": 10, "completion_tokens": 5}}')
    unknown = sorted(str(key) for key in usage if key not in _USAGE_KEYS)
    if unknown:
        raise ValueError(f'{where}: unknown "usage" key(s) {", ".join(unknown)}; use {", ".join(_USAGE_KEYS)}')
    prompt = _count(where, "prompt_tokens", usage.get("prompt_tokens"))
    completion = _count(where, "completion_tokens", usage.get("completion_tokens"))
    total = _count(where, "total_tokens", usage.get("total_tokens", prompt + completion))
    result: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total}
    for details in ("prompt_tokens_details", "completion_tokens_details"):
        if details not in usage:
            continue
        table = usage[details]
        if not isinstance(table, Mapping):
            raise ValueError(f'{where}: "usage" "{details}" must be an object like {{"cached_tokens": 3}}')
        result[details] = {str(key): _count(where, f"{details}.{key}", value) for key, value in table.items()}
    cached = result.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    if cached > prompt:
        raise ValueError(f'{where}: "usage" has {cached} cached_tokens, more than its {prompt} prompt_tokens')
    return result


def _check_message(where: str, item: Mapping[str, Any]) -> dict[str, Any]:
    if item.get("role", "assistant") != "assistant":
        raise ValueError(f'{where}: a message must have "role": "assistant"')
    content = item.get("content")
    tool_calls = item.get("tool_calls") or []
    if content is not None and not isinstance(content, str):
        raise ValueError(f'{where}: "content" must be a string or null')
    if content is None and not tool_calls:
        raise ValueError(f'{where}: a message needs "content", "tool_calls", or a "fault"')
    calls = []
    for number, call in enumerate(tool_calls):
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ValueError(f'{where}: tool call {number} needs "function": {{"name": ...}}')
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, str):  # a convenience: the wire always carries a string
            arguments = json.dumps(arguments)
        calls.append(
            {
                "id": call.get("id") or f"call_testdouble_{number}",
                "type": "function",
                "function": {"name": function["name"], "arguments": arguments},
            }
        )
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if calls:
        message["tool_calls"] = calls
    return message
