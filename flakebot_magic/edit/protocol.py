"""The edit protocol: the seven functions the model may call, their JSON schemas, and their arguments checked.

In this package "tool" means the deployed program only; what the model calls
are *protocol functions*. Their wire names and schemas (sent as the OpenAI
``tools`` of a request) are the model's interface and stay as documented in
``docs/edit-protocol.md``.
"""

from __future__ import annotations

from typing import Any

from ..host.fsutil import load_json

__all__ = ["FUNCTION_NAMES", "FUNCTION_SCHEMAS", "BadCall", "decode_call", "decode_reply", "text_argument"]

FUNCTION_NAMES = ("list_files", "read_file", "write_file", "replace_in_file", "delete_file", "run_checks", "finish")

_PATH = {"type": "string", "description": "a path relative to the crate root, e.g. src/main.rs"}


def _function(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


#: the OpenAI function schemas of :data:`FUNCTION_NAMES`, in that order
FUNCTION_SCHEMAS: list[dict[str, Any]] = [
    _function(
        "list_files",
        "List the files under a directory of the crate (recursively), with their line counts.",
        {"path": {**_PATH, "description": "a directory relative to the crate root; '.' for all"}},
        ["path"],
    ),
    _function(
        "read_file",
        "Read a text file, or the lines start_line..end_line of it (1-based, inclusive).",
        {"path": _PATH, "start_line": {"type": "integer", "minimum": 1}, "end_line": {"type": "integer", "minimum": 1}},
        ["path"],
    ),
    _function(
        "write_file",
        "Create or overwrite a file with the full content given.",
        {"path": _PATH, "content": {"type": "string"}},
        ["path", "content"],
    ),
    _function(
        "replace_in_file",
        "Replace the exact text `search` with `replace` in a file. "
        "`search` must occur exactly once; include surrounding lines to make it unique.",
        {"path": _PATH, "search": {"type": "string"}, "replace": {"type": "string"}},
        ["path", "search", "replace"],
    ),
    _function("delete_file", "Delete a file.", {"path": _PATH}, ["path"]),
    _function(
        "run_checks",
        "Run cargo build, cargo test and cargo clippy on the crate as it is now; "
        "get the compiler's diagnostics and the test results back. Each call uses one iteration.",
        {},
        [],
    ),
    _function(
        "finish",
        "Run the checks one last time and end the session if they pass and the tool "
        "contract is met. Give a short summary of what the tool does and how to call it.",
        {"summary": {"type": "string"}},
        ["summary"],
    ),
]


class BadCall(Exception):
    """A function call that cannot be carried out; its message is the whole reply to the model."""


def decode_call(call: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The function name and arguments of one call from the model (OpenAI's ``tool_calls`` entry), or :class:`BadCall`."""
    function = call.get("function", {})
    name = function.get("name", "")
    raw = function.get("arguments") or "{}"
    if name not in FUNCTION_NAMES:
        raise BadCall(f"error: there is no tool named {name!r}. The tools are: {', '.join(FUNCTION_NAMES)}.")
    try:
        args = load_json(raw)
    except ValueError as exc:
        raise BadCall(
            f"error: the arguments of {name} are not valid JSON ({exc}); nothing was changed. "
            "Send the call again with a complete JSON object."
        ) from None
    if not isinstance(args, dict):
        raise BadCall(f"error: the arguments of {name} must be a JSON object; nothing was changed.")
    return name, args


def text_argument(name: str, args: dict[str, Any], key: str) -> str:
    """The string argument ``key`` of the call to ``name``, or :class:`BadCall`."""
    value = args.get(key)
    if not isinstance(value, str):
        raise BadCall(f"error: {name} needs the string argument {key!r}; nothing was changed.")
    return value


_REQUIRED_TEXT = {
    f["function"]["name"]: [
        key
        for key in f["function"]["parameters"].get("required", [])
        if f["function"]["parameters"]["properties"][key].get("type") == "string"
    ]
    for f in FUNCTION_SCHEMAS
}


def decode_reply(calls: list[dict[str, Any]], *, cut: bool = False) -> list[str]:
    """Every call of one reply checked before any runs: one error per call (empty when all are well-formed).

    When one call cannot be carried out, none of the reply's calls runs (so a
    reply is never half-applied); each gets its answer: the broken one its
    error, the others that they did not run. ``cut``: the reply ended at the
    token limit, so none runs (what followed the cut cannot be known).
    """
    errors: list[str] = []
    for call in calls:
        try:
            name, args = decode_call(call)
            for key in _REQUIRED_TEXT.get(name, []):
                text_argument(name, args, key)
            errors.append("")
        except BadCall as exc:
            errors.append(str(exc))
    if cut:  # what followed the cut cannot be known: none runs
        return [
            (error or "not run:")
            + " Your reply was cut off at the token limit, so none of its calls ran; send fewer or smaller calls."
            for error in errors
        ]
    if not any(errors):
        return errors
    return [
        error or "not run: another call of this reply was malformed, so none of them ran; send them all again."
        for error in errors
    ]
