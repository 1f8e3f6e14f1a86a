"""Python names for what a tool names (schema properties, MCP tools, operations): always a valid, distinct identifier.

A tool chooses its parameter names; Python's call syntax, its keywords and
the names flakebot's own call takes must never make a signature fail to
build or a keyword reach the wrong parameter (issue 19: ``--raw``).
"""

from __future__ import annotations

import inspect
import keyword
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from flakebot_magic.clients.schema import RESERVED, make_function, plain_types, prepare_arguments, python_name

PROFILE = settings(max_examples=300, deadline=None, database=None)
#: names a tool could give that a Python signature cannot take as they are
HARD = sorted({*keyword.kwlist, *keyword.softkwlist, *RESERVED, "", "_", "__", "2d", "a-b", "a b", "é", "ﬁle", "名前"})
names = st.text(max_size=12) | st.sampled_from(HARD)


@PROFILE
@given(names, st.sets(names, max_size=6), st.sets(st.sampled_from(HARD), max_size=4))
def test_a_name_is_always_a_plain_distinct_identifier(name: str, taken: set[str], reserved: set[str]) -> None:
    made = python_name(name, taken, reserved=reserved)
    assert made.isidentifier() and made.isascii()
    assert not keyword.iskeyword(made) and made not in reserved and made not in taken
    assert python_name(name, taken, reserved=reserved) == made  # the same tool always gets the same names


def _send(sent: list[dict[str, Any]]) -> Any:
    def send(arguments: dict[str, Any]) -> str:
        sent.append(arguments)
        return "ok"

    return send


@PROFILE
@given(st.lists(names, min_size=1, max_size=8, unique=True))
def test_every_schema_property_gets_a_parameter_that_maps_back_to_it(wires: list[str]) -> None:
    schema = {"type": "object", "properties": {wire: {"type": "string"} for wire in wires}, "required": []}
    sent: list[dict[str, Any]] = []
    function = make_function("op", schema, _send(sent), doc="An operation.")
    parameters = list(inspect.signature(function).parameters)  # builds: valid, distinct names
    assert len(parameters) == len(wires)
    for name, wire in zip(parameters, wires, strict=True):
        assert function(**{name: f"value of {wire!r}"}) == "ok"
        assert sent.pop() == {wire: f"value of {wire!r}"}  # the tool gets its own name back


def test_each_keyword_and_reserved_name_is_a_parameter_of_its_own() -> None:
    wires = sorted({*keyword.kwlist, *keyword.softkwlist, *RESERVED})
    schema = {"type": "object", "properties": {wire: {"type": "integer"} for wire in wires}, "required": wires}
    sent: list[dict[str, Any]] = []
    function = make_function("op", schema, _send(sent), doc="An operation.")
    signature = inspect.signature(function)
    by_wire = dict(zip(wires, signature.parameters, strict=True))
    assert by_wire["class"] == "class_" and by_wire["timeout"] == "timeout_" and by_wire["match"] == "match"
    function(**{name: i for i, name in enumerate(by_wire.values())})
    assert sent == [{wire: i for i, wire in enumerate(wires)}]


# -- the plain fast path of a generated function: the same as prepare_arguments, or not taken ------------------

#: property schemas: the plain ones (a lone type) and ones that constrain more
property_schemas = st.sampled_from(
    [
        {"type": "string"},
        {"type": "string", "description": "d", "title": "t", "format": "uri"},
        {"type": "boolean"},
        {"type": "integer"},
        {"type": "number"},
        {"type": "integer", "minimum": 0},
        {"type": "string", "enum": ["a", "b"]},
        {"type": "string", "maxLength": 2},
        {"type": ["string", "null"]},
        {"anyOf": [{"type": "string"}, {"type": "integer"}]},
        {"type": "array", "items": {"type": "integer"}},
        {},
    ]
)
values = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4) | st.lists(st.integers())


@PROFILE
@given(
    properties=st.dictionaries(st.sampled_from(["a", "b", "c"]), property_schemas, min_size=1),
    required=st.sets(st.sampled_from(["a", "b", "c"])),
    additional=st.booleans(),
    data=st.data(),
)
def test_a_generated_function_sends_what_prepare_arguments_would(
    properties: dict[str, Any], required: set[str], additional: bool, data: Any
) -> None:
    """Every door checks arguments one way: a generated function's fast path for plain arguments sends exactly
    what :func:`prepare_arguments` returns, and raises when it raises (the fast path is then not taken; which of
    two problems is named first follows the signature's order)."""
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "required": sorted(required & set(properties)),
    }
    if not additional:
        schema["additionalProperties"] = False
    arguments = data.draw(st.dictionaries(st.sampled_from(sorted(properties)), values))
    sent: list[dict[str, Any]] = []
    function = make_function("f", schema, sent.append, doc="")
    try:
        expected: Any = prepare_arguments(arguments, schema, "f")
    except (TypeError, ValueError):
        expected = "refused"
    try:
        function(**arguments)
        got: Any = sent[0]
    except (TypeError, ValueError):
        got = "refused"
    assert got == expected
    if isinstance(got, dict):
        # 2.0 and 2 are equal, their types are not; the keys' order follows the signature, not the call
        assert {k: type(v) for k, v in got.items()} == {k: type(v) for k, v in expected.items()}


def test_plain_types_names_only_unconstrained_lone_types() -> None:
    schema = {
        "properties": {
            "s": {"type": "string", "description": "x"},
            "b": {"type": "boolean"},
            "i": {"type": "integer"},
            "n": {"type": "number"},
            "e": {"type": "string", "enum": ["a"]},
            "m": {"type": "integer", "maximum": 3},
            "u": {"type": ["string", "null"]},
        }
    }
    assert plain_types(schema) == {"s": (str,), "b": (bool,), "i": (int,)}


#: any JSON a server may send as a schema: every JSON Schema key this module reads, with values of any shape
_KEYS = st.sampled_from(
    [
        "type",
        "properties",
        "required",
        "items",
        "anyOf",
        "oneOf",
        "additionalProperties",
        "enum",
        "const",
        "default",
        "examples",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "minLength",
        "maxItems",
        "description",
        "x",
    ]
)
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=5)
    | st.sampled_from(["integer", "number", "string", "array", "object", "boolean", "null"])
)


def _json_of(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(inner, max_size=3) | st.dictionaries(_KEYS | st.text(max_size=3), inner, max_size=4)


_ANY_JSON = st.recursive(_SCALARS, _json_of, max_leaves=25)


@settings(max_examples=300, deadline=None)
@given(_ANY_JSON, _ANY_JSON)
def test_a_servers_schema_of_any_shape_makes_a_function_and_its_example(schema: Any, given: Any) -> None:
    """Red team 5: ``well_typed`` is the one door a server's schema comes in by; past it, params, examples,
    signatures, docstrings and argument checks never end with anything but the checks' own errors."""
    from flakebot_magic.clients.schema import docstring_of, example_value, params_of
    from flakebot_magic.clients.schema_shape import well_typed

    shaped = well_typed({"type": "object", "properties": schema if isinstance(schema, dict) else {}})
    params = params_of(shaped)
    [example_value(p.schema) for p in params]
    docstring_of("x", params, "object", "ToolError")
    function = make_function("f", shaped, lambda arguments: arguments, doc="x")
    try:
        function(**{p.name: given for p in params})
    except (TypeError, ValueError):
        pass  # the checks refusing the arguments: what a caller is told
