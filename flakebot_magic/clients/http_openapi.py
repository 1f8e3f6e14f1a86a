"""An HTTP service's OpenAPI document as Python functions: one per operation, with a signature and a docstring.

:class:`OpenApi` reads the document a service serves at ``/openapi.json``
(:func:`read_document`) into :class:`~flakebot_magic.clients.agents.ToolFunction`
objects; each sends its request through the client that made it (path, query
and JSON-body parameters) and returns the decoded body (:func:`decode`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ..errors import ToolError
from ..host.fsutil import load_json
from .agents import ToolFunction
from .schema import docstring_of, example_value, make_function, params_of, python_name
from .schema_shape import well_typed

if TYPE_CHECKING:
    import httpx

__all__ = ["OpenApi", "decode", "read_document"]

_METHODS = ("get", "post", "put", "patch", "delete")


def read_document(get: Callable[[str], httpx.Response]) -> dict[str, Any] | None:
    """The service's OpenAPI document (``get("/openapi.json")``), or None when it serves none that has paths."""
    try:
        answer = get("/openapi.json")
    except ToolError:
        return None
    if answer.status_code != 200:
        return None
    try:
        document = load_json(answer.content)
    except ValueError:
        return None
    return document if isinstance(document, dict) and isinstance(document.get("paths"), dict) else None


class OpenApi:
    """The operations of ``document``, as functions of the tool ``name`` that call ``send(verb, path, **options)``.

    ``health``: the service's readiness path, which is no operation.
    """

    def __init__(
        self, document: Mapping[str, Any], *, name: str, health: str, send: Callable[..., httpx.Response]
    ) -> None:
        self.document = document
        self.name = name
        self.health = health
        self.send = send

    def _resolve(self, schema: Any, depth: int = 0) -> Any:
        """Inline local ``$ref``s (``#/components/schemas/X``) of the OpenAPI document."""
        if depth > 20:
            return {}
        if isinstance(schema, Mapping):
            ref = schema.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/"):
                target: Any = self.document
                for part in ref[2:].split("/"):
                    target = target.get(part, {}) if isinstance(target, Mapping) else {}
                return self._resolve(target, depth + 1)
            return {k: self._resolve(v, depth + 1) for k, v in schema.items()}
        if isinstance(schema, list):
            return [self._resolve(v, depth + 1) for v in schema]
        return schema

    def functions(self, taken: set[str]) -> dict[str, ToolFunction]:
        """A function per operation of the document (its health path and the document's own left out), named
        apart from ``taken`` (the client's own attributes)."""
        functions: dict[str, ToolFunction] = {}
        for path, item in (self.document.get("paths") or {}).items():
            if not isinstance(item, Mapping) or path in (self.health, "/openapi.json"):
                continue
            shared = item.get("parameters") or []
            for method in _METHODS:
                operation = item.get(method)
                if not isinstance(operation, Mapping):
                    continue
                fn = self._operation(
                    str(path), method, self._resolve(operation), self._resolve(shared), taken | set(functions)
                )
                if fn is not None:
                    functions[fn.name] = fn
        return functions

    def _operation(
        self, path: str, method: str, operation: Mapping[str, Any], shared: list[Any], taken: set[str]
    ) -> ToolFunction | None:
        raw_name = operation.get("operationId") or f"{method}_{path}"
        name = python_name(str(raw_name), taken)
        properties: dict[str, Any] = {}
        required: list[str] = []
        where: dict[str, str] = {}  # wire name -> "path" | "query" | "body" | "whole-body"
        for parameter in [*shared, *(operation.get("parameters") or [])]:
            if not isinstance(parameter, Mapping) or parameter.get("in") not in ("path", "query"):
                continue
            if not isinstance(parameter.get("name"), str):
                continue
            wire = parameter["name"]
            schema = well_typed(parameter.get("schema")) or {"type": "string"}
            if isinstance(parameter.get("description"), str):
                schema.setdefault("description", parameter["description"])
            properties[wire] = schema
            where[wire] = str(parameter["in"])
            if parameter.get("required") or parameter.get("in") == "path":
                required.append(wire)
        given = operation.get("requestBody")
        request_body: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
        content = request_body.get("content")
        body = content.get("application/json") if isinstance(content, Mapping) else None
        if isinstance(body, Mapping):
            schema = body.get("schema") or {}
            fields = schema.get("properties") if isinstance(schema, Mapping) else None
            if isinstance(fields, Mapping) and fields:
                for wire, sub in fields.items():
                    if wire in properties:
                        continue  # a query parameter of the same name wins
                    properties[wire] = sub
                    where[wire] = "body"
                    named = schema.get("required")
                    if isinstance(named, list) and wire in named:
                        required.append(wire)
            else:
                properties["body"] = schema or {}
                where["body"] = "whole-body"
                if request_body.get("required"):
                    required.append("body")
        # the one place the service's schemas are taken in (any JSON): the shapes schema.py reads, or dropped
        parameters = well_typed({"type": "object", "properties": properties, "required": required})
        description = str(operation.get("summary") or operation.get("description") or f"{method.upper()} {path}")
        params = params_of(parameters)
        example_args = ", ".join(f"{p.name}={example_value(p.schema)!r}" for p in params if p.required)
        example = f"{self.name}.{name}({example_args})"
        verb = method.upper()

        def send(arguments: dict[str, Any]) -> Any:
            url = path
            query: dict[str, Any] = {}
            payload: dict[str, Any] = {}
            whole: Any = None
            for wire, value in arguments.items():
                place = where.get(wire)
                if value is None and place in ("path", "query"):
                    continue  # null is "not given" (docs/tool-contract.md); a URL cannot carry it anyway
                if place == "path":
                    url = url.replace("{" + wire + "}", quote(_query_text(value), safe=""))
                elif place == "query":
                    query[wire] = (
                        [_query_text(v) for v in value] if isinstance(value, (list, tuple)) else _query_text(value)
                    )
                elif place == "body":
                    payload[wire] = value
                elif place == "whole-body":
                    whole = value
            options: dict[str, Any] = {"params": query} if query else {}
            if whole is not None:
                options["json"] = whole
            elif payload or any(p == "body" for p in where.values()):
                options["json"] = payload
            answer = self.send(verb, url, **options)
            return decode(answer, f"{self.name}.{name}", verb, url)

        doc = docstring_of(
            f"{description}\n\n{verb} {path} on the service.",
            params,
            "object\n    The decoded JSON body (or the text of a non-JSON answer).",
            "ToolError\n    The service answered with an HTTP error status (``status``), or failed.\n"
            "TypeError, ValueError\n    An argument does not fit the operation's schema (checked before sending).",
            example,
        )
        function = make_function(name, parameters, send, doc=doc, qualname=f"{self.name}.{name}")
        return ToolFunction(
            name=name,
            description=description,
            parameters=parameters,
            function=function,
            example=example,
            remote_name=f"{verb} {path}",
            wire=send,
        )


def decode(answer: httpx.Response, what: str, verb: str, url: str) -> Any:
    """An operation's answer: its JSON body as Python values, else its text; a ToolError for an HTTP error."""
    if answer.status_code < 400 and "json" in answer.headers.get("content-type", ""):
        try:
            return load_json(answer.content)  # from the bytes: the text is decoded only when it is the answer
        except ValueError:
            return answer.text
    text = answer.text
    if answer.status_code >= 400:
        raise ToolError(
            f"{what}: HTTP {answer.status_code} from {verb} {url}: {text.strip()[:1500] or '(empty body)'}",
            stderr=text,
            status=answer.status_code,
        )
    return text


def _query_text(value: Any) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)
