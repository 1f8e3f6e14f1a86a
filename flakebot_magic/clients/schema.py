"""JSON Schema to Python: parameter names, type annotations, signatures, docstrings, argument checks.

MCP tools describe their arguments with a JSON Schema, OpenAPI operations
with parameter and body schemas. Both become ordinary Python functions: a
real :class:`inspect.Signature`, a numpydoc docstring, and arguments checked
before anything is sent (``TypeError`` for a wrong type, a missing or an
unknown argument; ``ValueError`` for a value outside the schema's range).

Only the keywords tools commonly use are checked: ``type``, ``required``,
``properties``, ``additionalProperties``, ``enum``, ``const``, ``items``,
``minimum``/``maximum`` (and the exclusive forms), ``minLength``/
``maxLength``, ``minItems``/``maxItems``, ``anyOf``/``oneOf``. The server
checks the rest.

:func:`prepare_arguments` is the one way arguments go out, from a Python call,
``tool.call(tool_call)`` and the MCP bridge alike (docs/tool-contract.md,
"Arguments"): ``None``/``null`` for an optional argument means "not given";
NaN and infinities are refused (JSON cannot carry them); a whole float for an
``integer`` parameter is sent as an integer (``2.0`` -> ``2``; ``2.5`` is a
``TypeError``).
"""

from __future__ import annotations

import inspect
import json
import keyword
import math
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Optional, Union

from ..untrusted import safe_text

__all__ = [
    "Param",
    "annotation_of",
    "check_arguments",
    "example_value",
    "make_function",
    "nonfinite",
    "params_of",
    "plain_types",
    "prepare_arguments",
    "python_name",
    "sentence",
]

#: names an MCP tool's or an HTTP operation's generated function never gives a parameter
RESERVED = frozenset({"self", "timeout"})


def python_name(name: str, taken: Iterable[str] = (), *, reserved: Iterable[str] = RESERVED, empty: str = "arg") -> str:
    """The Python name of something a tool names: an MCP tool, an operation, a schema property, a ``--help`` option.

    The one rule, so that a signature always builds and a call maps back to
    the tool's own name (kept beside it, as the wire name or the flag):

    1. ASCII only: the name is decomposed (NFKD: ``é`` -> ``e``, ``ﬁ`` ->
       ``fi``), every character but a letter, digit or ``_`` becomes ``_``, and
       ``_`` at either end goes (Python normalizes identifiers in source, so a
       non-ASCII parameter could not be passed by keyword as written);
    2. nothing left: ``empty``; a leading digit gets a leading ``_``;
    3. a Python keyword (``class``, ``from``) or a ``reserved`` name (one the
       call itself takes: ``timeout``; for a command-line tool ``raw``,
       ``input``, ``env`` ...) gets a trailing ``_``;
    4. then ``_`` is added until the name is not in ``taken`` (the names given
       before it, in the tool's order).

    >>> python_name("dry-run"), python_name("2d"), python_name("class"), python_name("café")
    ('dry_run', '_2d', 'class_', 'cafe')
    >>> python_name("raw", reserved={"raw"}), python_name("raw", taken={"raw_"}, reserved={"raw"})
    ('raw_', 'raw__')
    """
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode("ascii")
    ident = re.sub(r"[^A-Za-z0-9_]", "_", ascii_name).strip("_") or empty
    if ident[0].isdigit():
        ident = "_" + ident
    taken = set(taken)
    if keyword.iskeyword(ident) or ident in set(reserved):
        ident += "_"
    while ident in taken:
        ident += "_"
    return ident


_SIMPLE: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "null": type(None),
}


def annotation_of(schema: Mapping[str, Any]) -> Any:
    """The Python type a schema describes: ``{"type": "integer"}`` -> ``int``."""
    if schema.get("enum"):
        values = tuple(v for v in schema["enum"] if isinstance(v, (str, int, bool)) or v is None)
        if values:
            return Literal[values]
    if "const" in schema:  # a Literal holds scalars only (a const [] or {} is any value of its type)
        const = schema["const"]
        return Literal[const] if isinstance(const, (str, int, bool)) or const is None else Any
    for key in ("anyOf", "oneOf"):
        if key in schema:
            options = [annotation_of(s) for s in schema[key] if isinstance(s, Mapping)]
            return Union[tuple(options)] if options else Any
    kind = schema.get("type")
    if isinstance(kind, list):
        options = [annotation_of({**schema, "type": k}) for k in kind]
        return Union[tuple(options)] if options else Any
    if kind == "number":
        return Union[int, float]
    if kind == "array":
        items = schema.get("items")
        return list[annotation_of(items)] if isinstance(items, Mapping) and items else list[Any]  # type: ignore[misc]
    if kind == "object":
        return dict[str, Any]
    return _SIMPLE.get(kind, Any) if isinstance(kind, str) else Any


def _type_label(schema: Mapping[str, Any]) -> str:
    annotation = annotation_of(schema)
    text = inspect.formatannotation(annotation)
    return text.replace("typing.", "")


def example_value(schema: Any) -> Any:
    """A plausible value for a schema, for usage examples.

    Total over any JSON: a server's schema is its data, so a part of another shape (a ``minimum`` of
    ``1e999`` or ``"abc"``, an ``anyOf`` that is a string) is passed over, never a traceback.
    """
    if not isinstance(schema, Mapping):
        return "text"
    if "default" in schema:
        return schema["default"]
    if "examples" in schema and isinstance(schema["examples"], list) and schema["examples"]:
        return schema["examples"][0]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            return example_value(options[0])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    low = schema.get("minimum")
    if not (isinstance(low, (int, float)) and math.isfinite(low)):
        low = None
    if kind == "integer":
        return 1 if low is None else max(1, int(low))
    if kind == "number":
        return 1.5 if low is None else max(1.5, float(low))
    if kind == "boolean":
        return True
    if kind == "array":
        return [example_value(schema.get("items") or {"type": "string"})]
    if kind == "object":
        properties, required = schema.get("properties"), schema.get("required")
        if not isinstance(properties, Mapping) or not isinstance(required, list):
            return {}
        return {k: example_value(v) for k, v in properties.items() if k in required}
    return "text"


# -- checking --------------------------------------------------------------------------


def _is_type(value: Any, kind: str) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "null":
        return value is None
    if kind == "array":
        return isinstance(value, (list, tuple))
    if kind == "object":
        return isinstance(value, Mapping)
    return True


def _problem(value: Any, schema: Mapping[str, Any], where: str) -> tuple[type[Exception], str] | None:
    """The first way ``value`` breaks ``schema``: (TypeError or ValueError, message), else None."""
    if not isinstance(schema, Mapping):
        return None
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if options and all(_problem(value, option, where) for option in options):
            labels = " or ".join(_type_label(o) for o in options)
            return TypeError, f"{where} must be {labels}, not {value!r}"
    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        if not any(_is_type(value, k) for k in kinds):
            return TypeError, f"{where} must be {_type_label(schema)}, not {type(value).__name__} {value!r}"
    if "enum" in schema and value not in schema["enum"]:
        return ValueError, f"{where} must be one of {', '.join(map(repr, schema['enum']))}, not {value!r}"
    if "const" in schema and value != schema["const"]:
        return ValueError, f"{where} must be {schema['const']!r}, not {value!r}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        bounds: tuple[tuple[str, Callable[[float, float], bool], str], ...] = (
            ("minimum", lambda v, b: v >= b, "at least"),
            ("maximum", lambda v, b: v <= b, "at most"),
            ("exclusiveMinimum", lambda v, b: v > b, "more than"),
            ("exclusiveMaximum", lambda v, b: v < b, "less than"),
        )
        for key, test, words in bounds:
            bound = schema.get(key)
            if isinstance(bound, (int, float)) and not isinstance(bound, bool) and not test(value, bound):
                return ValueError, f"{where} must be {words} {bound}, not {value!r}"
    if isinstance(value, str):
        if isinstance(schema.get("minLength"), int) and len(value) < schema["minLength"]:
            return ValueError, f"{where} must have at least {schema['minLength']} characters"
        if isinstance(schema.get("maxLength"), int) and len(value) > schema["maxLength"]:
            return ValueError, f"{where} must have at most {schema['maxLength']} characters"
    if isinstance(value, (list, tuple)):
        if isinstance(schema.get("minItems"), int) and len(value) < schema["minItems"]:
            return ValueError, f"{where} must have at least {schema['minItems']} items"
        if isinstance(schema.get("maxItems"), int) and len(value) > schema["maxItems"]:
            return ValueError, f"{where} must have at most {schema['maxItems']} items"
        items = schema.get("items")
        if isinstance(items, Mapping):
            for index, item in enumerate(value):
                found = _problem(item, items, f"{where}[{index}]")
                if found:
                    return found
    if isinstance(value, Mapping) and (schema.get("properties") or "required" in schema):
        return _object_problem(value, schema, where)
    return None


def _object_problem(
    value: Mapping[str, Any], schema: Mapping[str, Any], where: str
) -> tuple[type[Exception], str] | None:
    properties: Mapping[str, Any] = schema.get("properties") or {}
    missing = [k for k in schema.get("required", []) if k not in value]
    top = where == "arguments"
    if missing:
        if top:  # Python's own words for a call
            return TypeError, f"missing a required argument: {', '.join(map(repr, missing))}"
        return TypeError, f"{where} is missing {', '.join(map(repr, missing))}"
    if schema.get("additionalProperties") is False:
        extra = [k for k in value if k not in properties]
        if extra:
            if top:
                known = ", ".join(map(repr, properties)) or "none"
                return TypeError, f"got an unexpected argument {', '.join(map(repr, extra))} (it takes {known})"
            return TypeError, f"{where} has unexpected {', '.join(map(repr, extra))}"
    for key, item in value.items():
        if key in properties:
            found = _problem(item, properties[key], f"{where}[{key!r}]" if where != "arguments" else repr(key))
            if found:
                return found
    return None


#: exact types that hold no NaN, no path and nothing nested
_PLAIN = frozenset({str, int, bool, type(None)})


def nonfinite(value: Any, where: str = "") -> str | None:
    """Where ``value`` holds a NaN or an infinity (``"b"``, ``"xs[2]"``), else None."""
    if type(value) in _PLAIN:
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return where or "the value"
    if isinstance(value, Mapping):
        for key, item in value.items():
            found = nonfinite(item, f"{where}[{key!r}]" if where else repr(key))
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = nonfinite(item, f"{where}[{index}]")
            if found:
                return found
    return None


def refuse_nonfinite(arguments: Mapping[str, Any], function: str = "") -> None:
    """Raise ``ValueError`` when an argument holds NaN or an infinity: JSON has no such numbers."""
    found = nonfinite(arguments)
    if found is not None:
        prefix = f"{function}(): " if function else ""
        raise ValueError(
            f"{prefix}argument {found} is NaN or infinite, which JSON cannot carry, so nothing was sent; "
            "pass a finite number"
        )


def _kinds(schema: Mapping[str, Any]) -> set[str]:
    kind = schema.get("type")
    kinds = set(kind) if isinstance(kind, list) else {kind} if isinstance(kind, str) else set()
    for key in ("anyOf", "oneOf"):
        for option in schema.get(key) or []:
            if isinstance(option, Mapping):
                kinds |= _kinds(option)
    return kinds


def exact_numbers(value: Any, schema: Any) -> Any:
    """``value`` with whole floats turned into ints where ``schema`` wants an integer (and no other number)."""
    if not isinstance(schema, Mapping):
        return value
    if isinstance(value, float) and value.is_integer():
        kinds = _kinds(schema)
        return int(value) if "integer" in kinds and "number" not in kinds else value
    if isinstance(value, Mapping):
        properties = schema.get("properties") or {}
        return {k: exact_numbers(v, properties.get(k)) for k, v in value.items()}
    if isinstance(value, list):
        items = schema.get("items")
        return [exact_numbers(v, items) for v in value]
    return value


def prepare_arguments(arguments: Mapping[str, Any], schema: Mapping[str, Any], function: str = "") -> dict[str, Any]:
    """The arguments exactly as they go out: the one rule of every door (Python calls, ``call()``, the bridge).

    ``None`` for an optional argument means "not given" and is left out;
    for a required one it is the value ``null`` (so it must fit the schema).
    Paths become strings and tuples lists; NaN and infinities raise
    ``ValueError``; the arguments are checked against ``schema``
    (:func:`check_arguments`); a whole float for an integer parameter becomes
    an ``int``.
    """
    required = set(schema.get("required") or [])
    wire = {str(k): jsonable(v) for k, v in arguments.items() if v is not None or k in required}
    refuse_nonfinite(wire, function)
    check_arguments(wire, schema, function)
    return {k: exact_numbers(v, (schema.get("properties") or {}).get(k)) for k, v in wire.items()}


#: keys of a property's schema that describe it and constrain nothing (no check of :func:`_problem` reads them)
_DESCRIPTIVE = frozenset({"type", "description", "title", "default", "examples", "format", "deprecated", "$comment"})
#: a lone JSON type -> the exact Python types that pass it as they are (no NaN, nothing nested, nothing converted)
_EXACT: dict[str, tuple[type, ...]] = {"string": (str,), "boolean": (bool,), "integer": (int,)}


def plain_types(schema: Mapping[str, Any]) -> dict[str, tuple[type, ...]]:
    """Per property of an object schema, the exact types whose values :func:`prepare_arguments` sends as they are.

    A property qualifies when its schema is a lone ``string``, ``boolean`` or
    ``integer`` type and nothing else that constrains (no ``enum``, bounds,
    lengths, ``anyOf`` ...). Arguments that are all of those types, every
    required one given, pass every check unchanged: a generated function
    sends them without walking the checks (some microseconds a call).
    """
    table: dict[str, tuple[type, ...]] = {}
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    for key, sub in (properties if isinstance(properties, Mapping) else {}).items():
        if isinstance(sub, Mapping) and set(sub) <= _DESCRIPTIVE and isinstance(sub.get("type"), str):
            exact = _EXACT.get(sub["type"])
            if exact is not None:
                table[str(key)] = exact
    return table


def check_arguments(arguments: Mapping[str, Any], schema: Mapping[str, Any], function: str = "") -> None:
    """Raise ``TypeError`` or ``ValueError`` when ``arguments`` break ``schema`` (an object schema)."""
    found = _object_problem(arguments, schema, "arguments")
    if found is not None:
        error, message = found
        prefix = f"{function}(): " if function else ""
        raise error(f"{prefix}argument {message}" if message.startswith("'") else f"{prefix}{message}")


def jsonable(value: Any) -> Any:
    """Tuples to lists, paths to strings: what ``json.dumps`` can send."""
    if type(value) in _PLAIN:  # the common argument: no ABC checks (a Mapping check costs a microsecond)
        return value
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "__fspath__"):
        return str(value.__fspath__())
    return value


# -- functions -------------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    """One argument of a generated function: its Python name, wire name and schema."""

    name: str
    wire: str
    schema: Mapping[str, Any]
    required: bool

    @property
    def description(self) -> str:
        return str(self.schema.get("description") or self.schema.get("title") or "")


def params_of(schema: Mapping[str, Any]) -> list[Param]:
    """The parameters an object schema describes, required ones first (the schema's order within each)."""
    properties: Mapping[str, Any] = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    taken: set[str] = set()
    params: list[Param] = []
    for wire, sub in properties.items():
        name = python_name(wire, taken)
        taken.add(name)
        params.append(Param(name, wire, sub if isinstance(sub, Mapping) else {}, wire in required))
    return sorted(params, key=lambda p: not p.required)


def _constraints(schema: Mapping[str, Any]) -> str:
    notes = []
    if "default" in schema:
        notes.append(f"default {json.dumps(schema['default'])}")
    for key, words in (("minimum", ">="), ("maximum", "<="), ("exclusiveMinimum", ">"), ("exclusiveMaximum", "<")):
        if key in schema:
            notes.append(f"{words} {schema[key]}")
    if "minLength" in schema:
        notes.append(f"at least {schema['minLength']} characters")
    if "maxLength" in schema:
        notes.append(f"at most {schema['maxLength']} characters")
    if "pattern" in schema:
        notes.append(f"matches {schema['pattern']}")
    if "format" in schema:
        notes.append(f"format {schema['format']}")
    return "; ".join(notes)


def signature_of(params: list[Param], returns: Any = Any) -> inspect.Signature:
    parameters = []
    for p in params:
        annotation = annotation_of(p.schema)
        if p.required:
            parameters.append(inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=annotation))
        else:
            parameters.append(
                inspect.Parameter(
                    p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation=Optional[annotation]
                )
            )
    return inspect.Signature(parameters, return_annotation=returns)


def sentence(text: str) -> str:
    """``text`` stripped, ending in a full stop when it ends in none of ``.!?:`` (``A hex viewer`` -> ``A hex viewer.``)."""
    text = text.strip()
    return text if not text or text[-1] in ".!?:" or text.endswith("```") else text + "."


def docstring_of(summary: str, params: list[Param], returns: str, raises: str, example: str = "") -> str:
    """A numpydoc docstring; the summary's paragraphs end in a full stop, as pydoc and IPython show them."""
    paragraphs = [sentence(part) for part in summary.strip().split("\n\n") if part.strip()]
    lines = ["\n\n".join(paragraphs) or "(no description)", ""]
    if params:
        lines += ["Parameters", "----------"]
        for p in params:
            label = _type_label(p.schema) + ("" if p.required else ", optional")
            lines.append(f"{p.name} : {label}")
            text = p.description
            notes = _constraints(p.schema)
            if notes:
                text = f"{text} ({notes})" if text else notes
            if p.wire != p.name:
                text = f"{text} [sent as {p.wire!r}]".strip()
            if text:
                lines.append(f"    {text}")
        lines.append("")
    lines += ["Returns", "-------", returns, "", "Raises", "------", raises]
    if example:
        lines += ["", "Examples", "--------", f">>> {example}  # doctest: +SKIP"]
    return safe_text("\n".join(lines))  # the tool's own words are in it; help() and ``?`` print it


def make_function(
    name: str,
    schema: Mapping[str, Any],
    send: Callable[[dict[str, Any]], Any],
    *,
    doc: str,
    qualname: str = "",
    returns: Any = Any,
) -> Callable[..., Any]:
    """A Python function with a real signature that checks its arguments, then calls ``send(wire_args)``.

    The arguments go through :func:`prepare_arguments`: ``None`` for an
    optional argument means "not given" (it is left out of the wire
    arguments), NaN and infinities are refused, whole floats for integer
    parameters are sent as integers.
    """
    params = params_of(schema)
    signature = signature_of(params, returns)
    by_name = {p.name: p for p in params}
    # a call by keywords alone, all known and the required ones there, needs no Signature.bind (10 us per call):
    # the same arguments in the signature's order; anything else goes through bind and its errors
    order = list(signature.parameters)
    named = {
        key
        for key, p in signature.parameters.items()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    needed = {key for key in named if signature.parameters[key].default is inspect.Parameter.empty}
    simple = len(named) == len(order)
    # arguments of plain types only, every required one given: prepare_arguments would send them as they are
    plain = plain_types(schema)
    required = frozenset(str(key) for key in schema.get("required") or [])

    def function(*args: Any, **kwargs: Any) -> Any:
        if simple and not args and named.issuperset(kwargs) and needed.issubset(kwargs):
            wire = {by_name[key].wire: kwargs[key] for key in order if key in kwargs}
        else:
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError as exc:
                raise TypeError(f"{name}(): {exc}. Signature: {name}{signature}") from None
            wire = {by_name[key].wire: value for key, value in bound.arguments.items()}
        if required.issubset(wire) and all(type(value) in plain.get(key, ()) for key, value in wire.items()):
            return send(wire)
        return send(prepare_arguments(wire, schema, name))

    function.__name__ = name
    function.__qualname__ = qualname or name
    function.__doc__ = doc
    function.__signature__ = signature  # type: ignore[attr-defined]
    return function
