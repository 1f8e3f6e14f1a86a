"""The edit protocol: the seven functions the model may call, their schemas, and how a bad call is answered."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flakebot_magic.edit.protocol import FUNCTION_NAMES, FUNCTION_SCHEMAS, BadCall, decode_call, text_argument


def test_the_protocol_is_exactly_the_seven_functions() -> None:
    assert FUNCTION_NAMES == (
        "list_files",
        "read_file",
        "write_file",
        "replace_in_file",
        "delete_file",
        "run_checks",
        "finish",
    )
    assert [t["function"]["name"] for t in FUNCTION_SCHEMAS] == list(FUNCTION_NAMES)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in FUNCTION_SCHEMAS}
    assert schemas["read_file"]["required"] == ["path"]
    assert set(schemas["read_file"]["properties"]) == {"path", "start_line", "end_line"}
    assert schemas["replace_in_file"]["required"] == ["path", "search", "replace"]
    assert schemas["finish"]["required"] == ["summary"]
    assert schemas["run_checks"]["properties"] == {}


def test_the_protocol_document_names_every_function() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "edit-protocol.md").read_text()
    for name in FUNCTION_NAMES:
        assert f"`{name}(" in doc, name


@pytest.mark.parametrize(
    ("call", "reply"),
    [
        ({"function": {"name": "rm_rf", "arguments": "{}"}}, "error: there is no tool named 'rm_rf'"),
        ({"function": {"name": "read_file", "arguments": '{"path": '}}, "are not valid JSON"),
        ({"function": {"name": "read_file", "arguments": "[1]"}}, "must be a JSON object"),
    ],
)
def test_a_bad_call_is_answered_and_changes_nothing(call: dict[str, object], reply: str) -> None:
    with pytest.raises(BadCall, match=re.escape(reply)):
        decode_call(call)


def test_arguments_are_decoded_and_checked() -> None:
    name, args = decode_call({"function": {"name": "read_file", "arguments": '{"path": "src/lib.rs"}'}})
    assert (name, text_argument(name, args, "path")) == ("read_file", "src/lib.rs")
    assert decode_call({"function": {"name": "run_checks", "arguments": ""}}) == ("run_checks", {})
    with pytest.raises(BadCall, match="write_file needs the string argument 'content'; nothing was changed"):
        text_argument("write_file", {"content": 3}, "content")
