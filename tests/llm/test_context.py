"""The bounded context: texts cut in the middle within a byte cap, conversations compacted without breaking pairs."""

from __future__ import annotations

import copy
import json
import random
import re
from typing import Any

import pytest

from flakebot_magic.llm.context import COMPACT_AT, COMPACT_TO, cap_middle, compact
from flakebot_magic.llm.usage import estimate_tokens

MARKER = re.compile(r"\n\[\.\.\. ([\d,]+) bytes cut from the middle \.\.\.\]\n")


# -- cap_middle ---------------------------------------------------------------------------


def test_five_megabytes_of_test_output_fit_the_cap_with_head_and_tail() -> None:
    lines = [f"test case_{i:06d} ... ok" for i in range(250_000)]
    output = "running 250000 tests\n" + "\n".join(lines) + "\ntest result: FAILED. 249999 passed; 1 failed\n"
    assert len(output.encode()) > 5_000_000
    cap = 64 * 1024
    capped = cap_middle(output, cap)
    assert len(capped.encode()) <= cap
    assert len(capped.encode()) > cap - 100  # the room is used, not wasted
    assert capped.startswith("running 250000 tests\ntest case_000000 ... ok")
    assert capped.endswith("test result: FAILED. 249999 passed; 1 failed\n")
    [cut] = MARKER.findall(capped)
    head, tail = MARKER.split(capped)[0], MARKER.split(capped)[2]
    # the marker says exactly how much is gone
    assert int(cut.replace(",", "")) == len(output.encode()) - len(head.encode()) - len(tail.encode())
    assert output.startswith(head) and output.endswith(tail)


def test_a_text_within_the_cap_is_returned_as_is() -> None:
    text = "fn main() {}\n" * 10
    assert cap_middle(text, len(text.encode())) is text


@pytest.mark.parametrize("limit", [60, 61, 62, 63, 100, 101, 1000])
def test_multibyte_characters_are_never_split(limit: int) -> None:
    text = "é" * 300 + "😀" * 300 + "日本" * 300
    capped = cap_middle(text, limit)
    data = capped.encode()
    assert len(data) <= limit
    data.decode("utf-8")  # valid UTF-8
    head = MARKER.split(capped)[0]
    assert text.startswith(head) and head


def test_a_cap_too_small_for_the_marker_keeps_the_head() -> None:
    assert cap_middle("abcdefghij" * 100, 10) == "abcdefghij"
    assert cap_middle("abc" * 100, 0) == ""


# -- estimate_tokens ----------------------------------------------------------------------


def test_the_estimate_grows_with_the_text() -> None:
    small = estimate_tokens([{"role": "user", "content": "x" * 100}])
    large = estimate_tokens([{"role": "user", "content": "x" * 100_000}])
    assert 25_000 <= large <= 25_100
    assert small < 50


# -- compact ------------------------------------------------------------------------------


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def _conversation(turns: int, *, seed: int = 1, result_bytes: int = 6000) -> list[dict[str, Any]]:
    """A long edit session: reads, writes, check runs, some talk, a steering message now and then."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You edit a Rust crate. " * 200},
        {"role": "user", "content": "Make the tool print hex dumps in upper case."},
    ]
    for turn in range(turns):
        kind = rng.random()
        if kind < 0.1:
            messages.append({"role": "user", "content": f"steering {turn}: also accept --upper"})
            continue
        if kind < 0.2:
            messages.append({"role": "assistant", "content": f"thinking about turn {turn} " * rng.randint(5, 200)})
            continue
        calls = [
            _call(f"call_{turn}_{i}", name, {"path": "src/main.rs", "content": "fn main() {}\n" * rng.randint(1, 300)})
            for i, name in enumerate(rng.sample(["read_file", "write_file", "check", "list_files"], rng.randint(1, 3)))
        ]
        messages.append({"role": "assistant", "content": None if rng.random() < 0.5 else "ok", "tool_calls": calls})
        for call in calls:
            body = f"{call['function']['name']} result of turn {turn}\n" + "error[E0308]: mismatched types\n" * (
                rng.randint(result_bytes // 64, result_bytes // 32)
            )
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": body})
    return messages


def _assert_pairs_intact(messages: list[dict[str, Any]]) -> None:
    """Each tool message answers a call of the assistant message its run follows; each call is answered."""
    open_calls: set[str] | None = None
    for index, message in enumerate(messages):
        if message["role"] == "tool":
            assert open_calls is not None, f"message {index}: a tool result without an assistant call before it"
            assert message["tool_call_id"] in open_calls, f"message {index}: answers no open call"
            open_calls.discard(message["tool_call_id"])
            continue
        assert not open_calls, f"message {index}: calls left unanswered: {open_calls}"
        calls = message.get("tool_calls") or []
        open_calls = {c["id"] for c in calls} if message["role"] == "assistant" and calls else None
    assert not open_calls, f"calls left unanswered at the end: {open_calls}"


def test_a_short_conversation_is_left_alone() -> None:
    messages = _conversation(5)
    assert estimate_tokens(messages) < 100_000 * COMPACT_AT
    assert compact(messages, 100_000) == messages


def test_a_long_conversation_gets_under_the_target_with_a_stable_prefix_and_intact_pairs() -> None:
    messages = _conversation(400)
    before = copy.deepcopy(messages)
    context = 32_000
    assert estimate_tokens(messages) > 10 * context
    compacted = compact(messages, context)
    assert estimate_tokens(compacted) <= context * COMPACT_TO
    # the first two are the very same messages: byte-identical, so the provider's prompt cache serves them
    assert compacted[0] is messages[0] and compacted[1] is messages[1]
    assert json.dumps(compacted[:2]) == json.dumps(before[:2])
    _assert_pairs_intact(compacted)
    assert messages == before  # the input is not changed


def test_the_last_turns_are_kept_as_they_were() -> None:
    messages = _conversation(120, seed=3)
    compacted = compact(messages, 60_000, keep_last=6)
    assert estimate_tokens(compacted) <= 60_000 * COMPACT_TO
    assert compacted[-6:] == messages[-6:]
    _assert_pairs_intact(compacted)


def test_stubs_keep_ids_and_names_and_say_what_was_cut() -> None:
    messages = _conversation(60, seed=5)
    compacted = compact(messages, 40_000)
    stubbed = [m for m in compacted if m["role"] == "tool" and "cut to save context" in m["content"]]
    assert stubbed
    originals = {m["tool_call_id"]: m for m in messages if m["role"] == "tool"}
    for stub in stubbed:
        original = originals[stub["tool_call_id"]]["content"]
        assert stub["content"].startswith(original.splitlines()[0])  # the first line says what it was
        assert f"{len(original.encode()):,} bytes in all" in stub["content"]
    for message in compacted:  # arguments stay JSON objects, with the function names
        for call in message.get("tool_calls") or []:
            assert isinstance(json.loads(call["function"]["arguments"]), dict)
            assert call["function"]["name"] in {"read_file", "write_file", "check", "list_files"}


def test_an_earlier_compaction_is_a_prefix_of_the_next_while_stubs_suffice() -> None:
    messages = _conversation(80, seed=7)
    context = 80_000
    first = compact(messages[:-20], context)
    second = compact(messages, context)
    stubbed = [i for i, (a, b) in enumerate(zip(first, messages, strict=False)) if a != b]
    assert stubbed, "the first compaction stubbed nothing: make the conversation longer"
    last = max(stubbed)
    assert not any("were dropped" in str(m.get("content")) for m in second)
    assert second[: last + 1] == first[: last + 1]
    assert second[last + 1] != messages[last + 1]  # the second went further, from where the first stopped


def test_when_stubs_are_not_enough_whole_turns_are_dropped_with_one_note() -> None:
    messages = _conversation(600, seed=11, result_bytes=2000)
    compacted = compact(messages, 16_000)
    assert estimate_tokens(compacted) <= 16_000 * COMPACT_TO
    notes = [m for m in compacted if "earlier messages were dropped" in str(m.get("content"))]
    assert len(notes) == 1 and compacted[2] is notes[0]
    _assert_pairs_intact(compacted)


def test_huge_recent_results_are_cut_in_the_middle_as_a_last_resort() -> None:
    messages = _conversation(4, seed=2)
    calls = [_call("big_1", "check", {}), _call("big_2", "read_file", {"path": "log"})]
    messages.append({"role": "assistant", "content": None, "tool_calls": calls})
    for call in calls:
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": "head\n" + "x" * 400_000 + "\ntail"})
    compacted = compact(messages, 50_000)
    assert estimate_tokens(compacted) <= 50_000 * COMPACT_TO
    for message in compacted[-2:]:
        assert message["content"].startswith("head\n") and message["content"].endswith("\ntail")
        assert MARKER.search(message["content"])
    _assert_pairs_intact(compacted)


@pytest.mark.parametrize("seed", range(25))
def test_pairs_survive_any_conversation_and_budget(seed: int) -> None:
    rng = random.Random(seed)
    messages = _conversation(rng.randint(0, 300), seed=seed, result_bytes=rng.choice([500, 3000, 20_000]))
    compacted = compact(messages, rng.choice([2_000, 8_000, 30_000, 200_000]), keep_last=rng.randint(0, 12))
    _assert_pairs_intact(compacted)
    assert compacted[:2] == messages[:2]
    assert all(a is b for a, b in zip(compacted[:2], messages[:2], strict=False))
