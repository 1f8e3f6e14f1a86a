"""Function calls written as text: every dialect read back exactly, cut calls refused, prose never read as a call."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from flakebot_magic.edit.protocol import FUNCTION_NAMES
from flakebot_magic.llm.dialects import (
    DIALECTS,
    LENIENT_LIMIT,
    Dialect,
    TextCall,
    TextCallRefused,
    read_calls,
    render,
    strict_form,
)

NAMES = FUNCTION_NAMES
#: what a dialect uses to mark a call; argument text holding one is refused, never misread (tested below)
_MARKERS = ("<tool_call>", "</tool_call>", "<function=", "</function>", "[TOOL_CALLS]")
_CALL_START = re.compile(r"""\{\s*(["']type["']\s*:\s*["']function["']\s*,\s*)?["']name["']\s*:""")


def _text(min_size: int = 0, max_size: int = 40) -> st.SearchStrategy[str]:
    """Argument text, keys and values alike: a marker in it is refused, not read back (tested below)."""
    return st.text(min_size=min_size, max_size=max_size).filter(lambda s: not any(m in s for m in _MARKERS))


_scalars = st.one_of(
    _text(),
    st.integers(-(10**6), 10**6),
    st.booleans(),
    st.none(),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text(max_size=10), inner, max_size=3),
    max_leaves=8,
)
calls = st.lists(
    st.builds(
        TextCall,
        st.sampled_from(NAMES),
        st.dictionaries(_text(min_size=1, max_size=12), _values, max_size=4),
    ),
    min_size=1,
    max_size=4,
)
# prose with the characters calls are made of, but neither a dialect's marker nor the start of a JSON call
_pieces = st.sampled_from([*"abc xyz\n\t{}[]<>\"':,`=_/.-!?", "name", "I'll ", "```", '"name"', "function"])
prose = st.lists(_pieces, max_size=30).map("".join)
prose = prose.filter(lambda s: not any(m in s for m in _MARKERS) and not _CALL_START.search(s))
spaces = st.sampled_from(["", " ", "\n", "\n\n", "  \n\t"])


def _written(calls_: list[TextCall], dialect: Dialect, fence: bool, before: str, after: str, pad: str) -> str:
    return f"{before}{pad}{render(calls_, dialect, fence=fence)}{pad}{after}"


@settings(max_examples=300, deadline=None)
@given(calls, st.sampled_from(DIALECTS), st.booleans(), prose, prose, spaces)
def test_any_calls_in_any_dialect_read_back_exactly(
    calls_: list[TextCall], dialect: Dialect, fence: bool, before: str, after: str, pad: str
) -> None:
    # a reply whose prose ends in an open "[" right before a list of calls is a list that holds prose
    assume(not (dialect == "json" and not fence and before.rstrip(" \n\t").endswith("[")))
    text = _written(calls_, dialect, fence, before, after, pad)
    found = read_calls(text, NAMES)
    assert found is not None
    assert list(found.calls) == calls_  # none dropped, none added, none changed, in order
    assert found.dialect == dialect
    assert found.describe().startswith(f"{len(calls_)} tool call")


@settings(max_examples=300, deadline=None)
@given(calls, st.sampled_from(DIALECTS), st.booleans(), prose, st.data())
def test_a_cut_reply_is_refused_whole(
    calls_: list[TextCall], dialect: Dialect, fence: bool, before: str, data: st.DataObject
) -> None:
    rendered = render(calls_, dialect, fence=fence)
    cut = data.draw(st.integers(1, len(rendered)), label="cut")  # mid-call, between calls, or after the last
    with pytest.raises(TextCallRefused) as refused:
        read_calls(before + "\n" + rendered[:cut], NAMES, truncated=True)
    assert "Nothing from this reply was applied" in str(refused.value)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.builds(TextCall, st.sampled_from(NAMES), st.just({"path": "src/main.rs"})), min_size=1, max_size=1))
def test_one_call_cut_anywhere_is_refused(calls_: list[TextCall]) -> None:
    for dialect in DIALECTS:
        rendered = render(calls_, dialect)
        for cut in range(1, len(rendered)):
            with pytest.raises(TextCallRefused):
                read_calls("Let me look.\n" + rendered[:cut], NAMES, truncated=True)


@settings(max_examples=400, deadline=None)
@given(prose)
def test_text_without_a_call_holds_none(text: str) -> None:
    assert read_calls(text, NAMES) is None


@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.sampled_from([*"ab {}[]<>\"':,\\`\n", *_MARKERS, '{"name": "run_checks"', "<function=x>", "```json"]),
        max_size=40,
    ).map("".join)
)
def test_reading_raises_nothing_but_the_refusal(text: str) -> None:
    try:
        found = read_calls(text, NAMES)
    except TextCallRefused as exc:
        assert str(exc).startswith("error: ") and "written exactly as" in str(exc)
        return
    if found is not None:  # what is read is a call of a known function with an object of arguments
        assert all(call.name in NAMES and isinstance(call.arguments, dict) for call in found.calls)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_marker_inside_an_argument_is_refused_never_misread(dialect: Dialect) -> None:
    for marker in _MARKERS:
        for arguments in ({"path": "a.txt", "content": f"x {marker} y"}, {"path": "a.txt", marker: "y"}):
            call = TextCall("write_file", arguments)  # in a value or in a key
            text = render([call], dialect)
            try:
                found = read_calls(text, NAMES)
            except TextCallRefused:
                continue
            assert found is not None and list(found.calls) == [call]


# -- what models really write (examples of each dialect's variants) -------------------------------

_READ = TextCall("read_file", {"path": "src/main.rs"})
_CHECKS = TextCall("run_checks", {})


@pytest.mark.parametrize(
    ("text", "expected", "dialect"),
    [
        (
            '<tool_call>\n{"name": "read_file", "arguments": "{\\"path\\": \\"src/main.rs\\"}"}\n</tool_call>',
            [_READ],
            "qwen",
        ),
        ("<tool_call>{'name': 'read_file', 'arguments': {'path': 'src/main.rs',},}</tool_call>", [_READ], "qwen"),
        ('<tool_call>\n```json\n{"name": "run_checks", "arguments": {}}\n```\n</tool_call>', [_CHECKS], "qwen"),
        ('<|python_tag|>{"name": "read_file", "parameters": {"path": "src/main.rs"}}', [_READ], "json"),
        ('{"type": "function", "name": "run_checks", "parameters": {}}', [_CHECKS], "json"),
        (
            '<function=read_file>{"path": "src/main.rs"}</function><function=run_checks></function>',
            [_READ, _CHECKS],
            "llama",
        ),
        (
            '[TOOL_CALLS] [{"name": "read_file", "arguments": {"path": "src/main.rs"}}, {"name": "run_checks"}]',
            [_READ, _CHECKS],
            "mistral",
        ),
        (
            'First I read it.\n```json\n[{"name": "read_file", "arguments": {"path": "src/main.rs"}}]\n```',
            [_READ],
            "json",
        ),
        (
            '{"name": "write_file", "arguments": {"path": "a", "content": "fn main() {\n}\n"}}',
            [TextCall("write_file", {"path": "a", "content": "fn main() {\n}\n"})],
            "json",
        ),
    ],
)
def test_variants_models_write(text: str, expected: list[TextCall], dialect: str) -> None:
    found = read_calls(text, NAMES)
    assert found is not None
    assert (list(found.calls), found.dialect) == (expected, dialect)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('<tool_call>{"name": "read_file", "arguments": {"path": "a"}}', "not closed"),
        ('<tool_call>{"name": "run_checks"}</tool_call> {"name": "finish", "arguments": {"summary": "s"}}', "mixes"),
        ('<tool_call>{"name": "run_checks"}</tool_call><function=finish>{}</function>', "mixes"),
        ('{"name": "deploy_everything", "arguments": {}}', "no function named 'deploy_everything'"),
        ('<tool_call>{"name": "read_file", "arguments": ["a"]}</tool_call>', "not a JSON object"),
        ('<tool_call>{"name": "read_file", "arguments": {"path": True}}</tool_call>', "not valid JSON"),
        ("all done </tool_call>", "closes no call"),
        ('[TOOL_CALLS] {"name": "run_checks"}', "not followed by a JSON list"),
        ('{"name": "read_file", "arguments": {"path": "a"}, "why": "to look"}', "unknown keys"),
    ],
)
def test_ambiguous_or_broken_calls_are_refused_with_the_form_to_use(text: str, problem: str) -> None:
    with pytest.raises(TextCallRefused) as refused:
        read_calls(text, NAMES)
    assert problem in refused.value.problem
    message = str(refused.value)
    assert "Nothing from this reply was applied" in message
    assert "written exactly as" in message


def test_the_refusal_shows_a_call_in_the_dialect_the_model_used() -> None:
    with pytest.raises(TextCallRefused) as refused:
        read_calls("<function=read_file>{'path': ", NAMES)
    assert refused.value.dialect == "llama"
    assert strict_form("llama", NAMES) in str(refused.value)
    assert strict_form("llama", NAMES) == '<function=read_file>{"path": "src/main.rs"}</function>'


def test_prose_json_that_is_not_a_call_is_no_call() -> None:
    for text in (
        'The crate\'s metadata is {"name": "serde", "version": "1.0"}.',
        "Use `let x = Foo { name: 1 };` and [1, 2].",
        '{"name": "read_file"} is the function I would call',  # no arguments: a known name alone is a call
    )[:2]:
        assert read_calls(text, NAMES) is None


def test_a_long_call_that_is_not_strict_json_is_refused_not_parsed_slowly() -> None:
    content = "x" * (LENIENT_LIMIT + 10)
    text = "<tool_call>{'name': 'write_file', 'arguments': {'path': 'a', 'content': '" + content + "'}}</tool_call>"
    with pytest.raises(TextCallRefused, match="no lenient reading"):
        read_calls(text, NAMES)
    strict = "<tool_call>" + json.dumps({"name": "write_file", "arguments": {"path": "a", "content": content}})
    found = read_calls(strict + "</tool_call>", NAMES)
    assert found is not None and found.calls[0].arguments["content"] == content


def test_deep_nesting_is_refused_not_a_crash() -> None:
    text = '<tool_call>{"name": "read_file", "arguments": ' + "[" * 100_000 + "]" * 100_000 + "}</tool_call>"
    with pytest.raises(TextCallRefused):
        read_calls(text, NAMES)


@settings(max_examples=100, deadline=None)
@given(calls, prose)
def test_the_text_protocol_shows_past_calls_in_the_form_it_asks_for(calls_: list[TextCall], before: str) -> None:
    from flakebot_magic.edit.protocol import FUNCTION_SCHEMAS
    from flakebot_magic.llm.dialects import as_text_conversation

    wire = [
        {"id": f"c{i}", "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
        for i, c in enumerate(calls_)
    ]
    conversation = [
        {"role": "system", "content": "You edit crates."},
        {"role": "assistant", "content": before, "tool_calls": wire},
        *({"role": "tool", "tool_call_id": w["id"], "content": "ok"} for w in wire),
    ]
    shown = as_text_conversation(conversation, FUNCTION_SCHEMAS)
    assert shown[0]["content"].startswith("You edit crates.\n\n## Calling functions")
    assert all(name in shown[0]["content"] for name in NAMES)
    assert all("tool_calls" not in m and m["role"] != "tool" for m in shown)
    found = read_calls(shown[1]["content"], NAMES)
    assert found is not None and list(found.calls) == calls_ and found.dialect == "qwen"
    assert [m["content"] for m in shown[2:]] == [f"Result of {c.name}:\nok" for c in calls_]
    assert conversation[1]["tool_calls"] == wire  # the conversation itself is not changed


@pytest.mark.timeout(120)  # a hang guard: a quadratic scan of these 1 MB replies would take hours
@pytest.mark.parametrize(
    "piece",
    [
        '{"name": 1} ',
        '[{"name": 1}',
        '[{"name": "run_checks"}, ',
        '{"name": ',
        "<tool_call>",
        "<function=read_file>",
        "[TOOL_CALLS] [",
        '{"{"',
        '{"name": "a", "b": {"name": 1}} ',
    ],
)
def test_a_hostile_reply_of_a_megabyte_is_read_in_linear_time(piece: str) -> None:
    text = piece * (1024 * 1024 // len(piece))
    try:
        found = read_calls(text, NAMES)
    except TextCallRefused:
        return
    assert found is None


@pytest.mark.timeout(120)  # a hang guard, as above
def test_a_megabyte_of_whole_calls_in_tags_is_read_in_linear_time() -> None:
    one = render([TextCall("run_checks", {})], "llama")
    found = read_calls(one * (1024 * 1024 // len(one)), NAMES)
    assert found is not None and len(found.calls) == 1024 * 1024 // len(one)


@settings(max_examples=300, deadline=None)
@given(calls, st.sampled_from(DIALECTS), st.booleans(), st.data())
def test_prose_between_calls_neither_adds_nor_drops_one(
    calls_: list[TextCall], dialect: Dialect, fence: bool, data: st.DataObject
) -> None:
    pieces = [data.draw(prose, label=f"prose {i}") for i in range(len(calls_) + 1)]
    # as above: prose ending in an open "[" right before a bare call makes a list that holds prose
    assume(dialect != "json" or fence or not any(p.rstrip(" \n\t").endswith("[") for p in pieces))
    text = pieces[0]
    for call, after in zip(calls_, pieces[1:], strict=True):
        text += "\n" + render([call], dialect, fence=fence) + "\n" + after
    found = read_calls(text, NAMES)
    assert found is not None and list(found.calls) == calls_ and found.dialect == dialect
