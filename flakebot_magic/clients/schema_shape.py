"""What a server's JSON Schema may hold before :mod:`~flakebot_magic.clients.schema` reads it: its shapes, or nothing."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["well_typed"]

#: JSON Schema's type names
_JSON_TYPES = frozenset({"string", "number", "integer", "boolean", "array", "object", "null"})
#: keys whose value must be a finite number
_BOUNDS = (
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def well_typed(schema: Any) -> dict[str, Any]:
    """A server's schema (any JSON: an MCP tool's ``inputSchema``, an OpenAPI parameter's) as this module reads it.

    The one place a schema is taken in: every key this module reads keeps its
    value only in the shape JSON Schema gives it (``type`` a name or a list
    of names, ``properties`` an object of schemas, ``required`` a list of
    names, ``anyOf``/``oneOf`` lists of schemas, ``$defs`` an object of
    schemas (a local ``$ref`` keeps its target: a schema flakebot serves again
    stays a valid JSON Schema 2020-12), bounds finite numbers ...); another
    shape is dropped, as are unknown keys but for scalar values.
    Before (red team 5), a ``minimum`` of ``1e999`` or ``"abc"``, or a list of
    ``properties``, ended the client's start with a traceback.
    """
    if not isinstance(schema, Mapping):
        return {}
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if not isinstance(key, str):
            continue
        if key == "type":
            kinds = [value] if isinstance(value, str) else value if isinstance(value, list) else []
            kept = [k for k in kinds if isinstance(k, str) and k in _JSON_TYPES]
            if kept:
                out[key] = kept[0] if isinstance(value, str) else kept
        elif key == "properties":
            if isinstance(value, Mapping):
                out[key] = {str(name): well_typed(sub) for name, sub in value.items()}
        elif key == "required":
            if isinstance(value, list):
                out[key] = [name for name in value if isinstance(name, str)]
        elif key == "items":
            if isinstance(value, Mapping):
                out[key] = well_typed(value)
        elif key in ("$defs", "definitions"):  # what a local "$ref" points into (pydantic's nested models)
            if isinstance(value, Mapping):
                out[key] = {str(name): well_typed(sub) for name, sub in value.items()}
        elif key == "x-mcp-header":
            continue  # an HTTP header the tool's own server mirrors; flakebot's servers do not (and mirror none)
        elif key in ("anyOf", "oneOf"):
            options = [well_typed(o) for o in value if isinstance(o, Mapping)] if isinstance(value, list) else []
            if options:
                out[key] = options
        elif key == "additionalProperties":
            if isinstance(value, bool):
                out[key] = value
            elif isinstance(value, Mapping):
                out[key] = well_typed(value)
        elif key in ("enum", "examples"):
            if isinstance(value, list) and value:
                out[key] = value
        elif key in ("const", "default"):
            out[key] = value
        elif key in _BOUNDS:
            if _finite(value):
                out[key] = value
        elif value is None or isinstance(value, (str, bool)) or _finite(value):
            out[key] = value  # descriptive (description, title, format, pattern ...) or checked by the server
    return out
