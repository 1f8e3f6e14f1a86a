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

from flakebot_magic.clients.schema import RESERVED, make_function, python_name

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
