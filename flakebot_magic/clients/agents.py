"""What an AI agent needs from a tool: OpenAI function schemas (strict mode), tool-call execution, usage text.

OpenAI's strict mode (``"strict": true``) accepts a subset of JSON Schema:
every object lists all its properties in ``required`` and sets
``additionalProperties: false``; an optional property is expressed as a
nullable type (``["string", "null"]``); value constraints such as
``minimum`` or ``default`` are not allowed. :func:`strict_schema` converts a
tool's schema to that subset (moving constraints into the description, where
the model still reads them), and :func:`strict_problems` lists what breaks
the rules, for tests.

A model's ``null`` for an optional argument means "not given" (the one rule
of :func:`flakebot_magic.clients.schema.prepare_arguments`, docs/tool-contract.md).

Names are kept where they are valid: an MCP tool ``pid`` of ``calc`` is the
function ``calc_pid`` (not the Python attribute's ``pid_``); only a name with
characters OpenAI or MCP reject is changed (:func:`agent_name`).
"""

from __future__ import annotations

import copy
import inspect
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..untrusted import make_fields_safe

__all__ = [
    "MCP_NAME_PATTERN",
    "NAME_PATTERN",
    "ToolFunction",
    "agent_name",
    "parse_tool_call",
    "strict_problems",
    "strict_schema",
]

#: keywords strict mode rejects; their meaning moves into the description
_UNSUPPORTED = (
    "default",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minItems",
    "maxItems",
    "uniqueItems",
    "minProperties",
    "maxProperties",
    "patternProperties",
    "unevaluatedProperties",
    "propertyNames",
    "contains",
    "minContains",
    "maxContains",
    "unevaluatedItems",
    "examples",
    "title",
    "$schema",
    "$id",
    "readOnly",
    "writeOnly",
    "deprecated",
    "nullable",
)
_ALLOWED = {
    "type",
    "description",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "const",
    "anyOf",
    "$defs",
    "$ref",
}
_TYPES = {"string", "number", "integer", "boolean", "object", "array", "null"}
#: a valid OpenAI function name
NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
#: a valid MCP tool name (the 2025-11-25 revision's rule; earlier ones are looser)
MCP_NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_.-]{1,128}$")


@dataclass
class ToolFunction:
    """One callable function of a tool, described for agents.

    ``parameters`` is the JSON Schema of its keyword arguments (an object);
    ``function`` is the Python function (with a signature) that checks and
    sends them; ``wire``, when set, takes the arguments named as in
    ``parameters`` (a model's names), checked against the schema first.
    ``remote_name`` is the name on the wire (an MCP tool's own name);
    ``open_arguments`` says keys beyond ``parameters``' properties are passed
    on (an MCP server whose schema allows them); otherwise they are refused.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    function: Callable[..., Any]
    example: str = ""
    remote_name: str = ""
    #: sends arguments named as in ``parameters`` (when they differ from the Python names)
    wire: Callable[[dict[str, Any]], Any] | None = None
    open_arguments: bool = False
    #: keywords ``function`` takes that a person is not shown (a CLI tool's ``env``, ``raw``): callable, unlisted
    hidden: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        make_fields_safe(self)  # a tool describes itself: shown in usage(), docstrings, the widget

    def signature_text(self) -> str:
        """The call as a person writes it, for the tool card and ``usage()``: ``md(*args, input=None, upper=False)``.

        The parameters of ``function``'s signature, without the :attr:`hidden` ones; ``name(...)`` when it
        has no signature to read.
        """
        try:
            signature = inspect.signature(self.function)
        except (TypeError, ValueError):
            return f"{self.name}(...)"
        parts = []
        for p in signature.parameters.values():
            if p.name in self.hidden:
                continue
            if p.kind is p.VAR_POSITIONAL:
                parts.append(f"*{p.name}")
            elif p.kind is p.VAR_KEYWORD:
                parts.append(f"**{p.name}")
            elif p.default is p.empty:
                parts.append(p.name)
            else:
                parts.append(f"{p.name}={p.default!r}")
        qual = getattr(self.function, "__qualname__", self.name)
        return f"{qual}({', '.join(parts)})"

    @property
    def enforced_schema(self) -> dict[str, Any]:
        """``parameters`` saying what is enforced: ``additionalProperties: false`` unless extra keys pass."""
        if self.open_arguments or self.parameters.get("additionalProperties") is False:
            return dict(self.parameters)
        return {**self.parameters, "additionalProperties": False}

    @property
    def public_name(self) -> str:
        """The name other programs see: the remote name where it is a valid MCP tool name, else the Python name."""
        remote = self.remote_name
        return remote if remote and MCP_NAME_PATTERN.match(remote) else self.name


def agent_name(tool: str, fn: ToolFunction, *, alone: bool = False) -> str:
    """The OpenAI function name of ``fn`` of ``tool``: ``calc_pid``; ``tool`` alone for a one-function tool of its name.

    The remote name is kept where it is a valid name; characters OpenAI
    rejects become ``_`` and the result is cut at 64 characters.
    """
    name = tool if alone and fn.name == tool else f"{tool}_{fn.public_name}"
    if not NAME_PATTERN.match(name):
        name = re.sub(r"[^a-zA-Z0-9_-]", "_", name)[:64]
    return name


def _describe_constraints(schema: Mapping[str, Any]) -> str:
    notes = []
    for key in _UNSUPPORTED:
        if key in schema and key not in ("title", "examples", "$schema", "$id", "nullable", "readOnly", "writeOnly"):
            notes.append(f"{key}: {json.dumps(schema[key])}")
    return "; ".join(notes)


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    if "anyOf" in schema:
        if not any(option.get("type") == "null" for option in schema["anyOf"]):
            schema["anyOf"] = [*schema["anyOf"], {"type": "null"}]
        return schema
    kind = schema.get("type")
    if isinstance(kind, list):
        if "null" not in kind:
            schema["type"] = [*kind, "null"]
    elif isinstance(kind, str):
        if kind != "null":
            schema["type"] = [kind, "null"]
    else:
        return {"anyOf": [schema, {"type": "null"}]}
    if "enum" in schema and None not in schema["enum"]:
        schema["enum"] = [*schema["enum"], None]
    return schema


def _convert(schema: Any, json_text: list[str] | None = None, name: str = "") -> dict[str, Any]:
    if not isinstance(schema, Mapping):
        return {"type": "string"}
    notes = _describe_constraints(schema)
    out: dict[str, Any] = {k: copy.deepcopy(v) for k, v in schema.items() if k in _ALLOWED}
    for key in ("oneOf",):  # strict mode knows anyOf only; oneOf's options are tried alike
        if key in schema and "anyOf" not in out:
            out["anyOf"] = copy.deepcopy(schema[key])
    kind = out.get("type")
    if kind is None and not any(k in out for k in ("anyOf", "enum", "const", "$ref")):
        kind = "object" if "properties" in out else "string"
        out["type"] = kind
    if isinstance(kind, list):
        out["type"] = [k for k in kind if k in _TYPES] or ["string"]
    if "anyOf" in out:
        out["anyOf"] = [_convert(option) for option in out["anyOf"]]
    if kind == "object" or (isinstance(kind, list) and "object" in kind):
        properties = out.get("properties") or {}
        if not properties and json_text is not None:
            # a free-form object cannot be strict: the model writes it as JSON text
            json_text.append(name)
            text = "A JSON object, written as JSON text."
            return {"type": "string", "description": f"{schema.get('description', '')} {text}".strip()}
        required = set(out.get("required") or [])
        out["properties"] = {}
        for key, sub in properties.items():
            converted = _convert(sub)
            out["properties"][key] = converted if key in required else _nullable(converted)
        out["required"] = list(properties)
        out["additionalProperties"] = False
    if kind == "array" or (isinstance(kind, list) and "array" in kind):
        out["items"] = _convert(out.get("items") or {"type": "string"})
    if notes:
        description = str(out.get("description") or "")
        out["description"] = f"{description} ({notes})".strip() if description else f"({notes})"
    return out


def strict_schema(parameters: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """``parameters`` in OpenAI's strict subset, and the top-level names that became JSON text."""
    json_text: list[str] = []
    properties = parameters.get("properties") or {}
    required = set(parameters.get("required") or [])
    out: dict[str, Any] = {
        "type": "object",
        "properties": {},
        "required": list(properties),
        "additionalProperties": False,
    }
    for key, sub in properties.items():
        converted = _convert(sub, json_text, key)
        out["properties"][key] = converted if key in required else _nullable(converted)
    if parameters.get("description"):
        out["description"] = parameters["description"]
    return out, tuple(json_text)


def strict_problems(schema: Any, where: str = "parameters") -> list[str]:
    """Every way ``schema`` breaks OpenAI's strict-mode rules (empty: it passes)."""
    problems: list[str] = []
    if not isinstance(schema, Mapping):
        return [f"{where} is not a schema object"]
    if where == "parameters":
        if schema.get("type") != "object":
            problems.append("the root must be an object schema")
        if "anyOf" in schema:
            problems.append("the root must not be anyOf")
    for key in schema:
        if key not in _ALLOWED:
            problems.append(f"{where}: keyword {key!r} is not supported in strict mode")
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    for k in kinds:
        if k not in _TYPES:
            problems.append(f"{where}: unknown type {k!r}")
    if not kinds and not any(k in schema for k in ("anyOf", "enum", "const", "$ref")):
        problems.append(f"{where}: has no type")
    if "object" in kinds:
        properties = schema.get("properties")
        if not isinstance(properties, Mapping):
            problems.append(f"{where}: an object needs properties")
            properties = {}
        if schema.get("additionalProperties") is not False:
            problems.append(f"{where}: additionalProperties must be false")
        if sorted(schema.get("required") or []) != sorted(properties):
            problems.append(f"{where}: every property must be required (optional ones nullable)")
        for key, sub in properties.items():
            problems += strict_problems(sub, f"{where}.{key}")
    if "array" in kinds:
        if "items" not in schema:
            problems.append(f"{where}: an array needs items")
        else:
            problems += strict_problems(schema["items"], f"{where}[]")
    if "enum" in schema:
        values = schema["enum"]
        if not isinstance(values, list) or not values:
            problems.append(f"{where}: enum must be a non-empty list")
        elif "null" in kinds and None not in values:
            problems.append(f"{where}: a nullable enum must list null")
    for index, option in enumerate(schema.get("anyOf") or []):
        problems += strict_problems(option, f"{where}.anyOf[{index}]")
    return problems


def openai_tool(name: str, fn: ToolFunction) -> tuple[dict[str, Any], tuple[str, ...]]:
    """One ``{"type": "function", ...}`` entry for ``tools=``, and its JSON-text parameters."""
    if not NAME_PATTERN.match(name):
        name = re.sub(r"[^a-zA-Z0-9_-]", "_", name)[:64]
    parameters, json_text = strict_schema(fn.parameters)
    description = fn.description.strip() or f"Call {name}."
    return (
        {
            "type": "function",
            "function": {"name": name, "description": description[:1024], "parameters": parameters, "strict": True},
        },
        json_text,
    )


def parse_tool_call(tool_call: Any) -> tuple[str, str, str]:
    """(id, function name, arguments JSON) of a tool call: an ``openai`` object or its dict form."""
    if isinstance(tool_call, Mapping):
        function = tool_call.get("function") or {}
        return str(tool_call.get("id") or ""), str(function.get("name") or ""), str(function.get("arguments") or "{}")
    function = getattr(tool_call, "function", None)
    return (
        str(getattr(tool_call, "id", "") or ""),
        str(getattr(function, "name", "") or ""),
        str(getattr(function, "arguments", "") or "{}"),
    )


def result_text(value: Any) -> str:
    """What goes back to the model: text as is, anything else as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)
