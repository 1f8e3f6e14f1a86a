"""The script a fake-openai server replays: its items (assistant messages and faults), checked and normalised."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Union

__all__ = ["FAULTS", "Script", "load_script"]

#: the faults a script item may name
FAULTS = ("status", "reset", "malformed", "stall", "flood")
_PLACEHOLDER = {"role": "assistant", "content": "partial reply from the scripted test double"}

Script = Union[Mapping[str, Any], Sequence[Mapping[str, Any]], "os.PathLike[str]", str]


def load_script(script: Script) -> list[dict[str, Any]]:
    """Read and check a script; return its items, normalised.

    Parameters
    ----------
    script
        ``{"responses": [...]}``, the bare list, or the path of a JSON file
        holding either.

    Raises
    ------
    ValueError
        An item is neither an assistant message nor a known fault; the
        message names the item's index.
    """
    if isinstance(script, (str, os.PathLike)):
        script = json.loads(Path(script).read_text(encoding="utf-8"))
    if isinstance(script, Mapping):
        if "responses" not in script:
            raise ValueError('a fake-openai script must be {"responses": [...]} or a list')
        script = script["responses"]
    if not isinstance(script, Sequence) or isinstance(script, (str, bytes)):
        raise ValueError("the fake-openai script's responses must be a list")
    return [_check_item(index, item) for index, item in enumerate(script)]


def _check_item(index: int, item: object) -> dict[str, Any]:
    where = f"fake-openai script item {index}"
    if not isinstance(item, Mapping):
        raise ValueError(f"{where} must be an object, not {type(item).__name__}")
    item = dict(item)
    if "fault" in item:
        fault = item["fault"]
        if fault not in FAULTS:
            raise ValueError(f"{where}: unknown fault {fault!r}; use one of {', '.join(FAULTS)}")
        if fault == "status" and not (isinstance(item.get("status"), int) and 400 <= item["status"] <= 599):
            raise ValueError(f'{where}: a "status" fault needs "status": an HTTP error code 400-599')
        if fault == "stall" and not (isinstance(item.get("seconds"), (int, float)) and item["seconds"] >= 0):
            raise ValueError(f'{where}: a "stall" fault needs "seconds": a number >= 0')
        if fault == "reset":
            after = item.get("after_chunks", 0)
            if not isinstance(after, int) or after < 0:
                raise ValueError(f'{where}: "after_chunks" must be an integer >= 0')
            item["message"] = _check_message(where, item.get("message", _PLACEHOLDER))
        return item
    return _check_message(where, item)


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
