"""Edit sessions with a model whose calls come back as text: each dialect ends green, cut calls are never applied.

The fake OpenAI server (a scripted test double) writes the scripted calls in
a dialect (:mod:`flakebot_magic.llm.dialects`) as a server without a tool
parser passes them; the loop talks to it through the official ``openai``
client, builds and tests tinyhex with real cargo in the sandbox, commits
with real git.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from editscripts import call, reply, tinyhex_done
from tinyhex_sessions import Session

from flakebot_magic.edit import FUNCTION_SCHEMAS
from flakebot_magic.events import Notice
from flakebot_magic.host.git import Git
from flakebot_magic.host.process import ProcessRunner
from flakebot_magic.llm.dialects import DIALECTS
from flakebot_magic.records.journal import Journal


def in_dialect(message: dict[str, Any], dialect: str, **extra: Any) -> dict[str, Any]:
    """A scripted reply whose calls the test double writes as text in ``dialect``."""
    return {**message, "dialect": dialect, **extra}


def _tinyhex(root: Path) -> str:
    binary = root / "target" / "flakebot-test" / "debug" / "tinyhex"
    return subprocess.run([str(binary)], input=b"\x01\xab", capture_output=True, check=True).stdout.decode()


@pytest.mark.cargo
@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_session_in_each_dialect_ends_green(session: Callable[..., Session], dialect: str) -> None:
    edit, finish = tinyhex_done()
    script = [
        in_dialect({**edit, "content": "I'll add the contract and a main."}, dialect, fence=dialect == "json"),
        in_dialect(finish, dialect, after="That is all."),
    ]
    s = session(script, timeout=5.0)
    outcome = s.loop.run("print standard input as hex")
    assert outcome.summary == "tinyhex prints its standard input as hex"
    assert _tinyhex(s.root) == "01ab\n"  # the tool was built (real cargo) from calls read from text
    read = [e.message for e in s.events if isinstance(e, Notice) and "read from text" in e.message]
    assert read[0] == f"2 tool calls read from text, {dialect} dialect"
    assert read[1] == f"1 tool call read from text, {dialect} dialect"
    # --tool-format auto (the default): native first, then the text protocol once the server showed it ignores tools
    first, second = s.server.requests
    assert first["tools"] == FUNCTION_SCHEMAS and "tools" not in second
    assert "<tool_call>" in second["messages"][0]["content"]  # the one strict form, in the system prompt
    assert not any(m["role"] == "tool" for m in second["messages"])  # results as user messages


@pytest.mark.cargo
def test_calls_read_from_text_are_marked_in_the_journal(session: Callable[..., Session], tmp_path: Path) -> None:
    journal = Journal.create(tmp_path / "journal", "tinyhex", request="hex", model="scripted", base_url="x")
    s = session([in_dialect(m, "llama") for m in tinyhex_done()], journal=journal, tool_format="native", timeout=5.0)
    s.loop.run("print standard input as hex")
    records = Journal.read(journal.path)
    marked = [r["read_from_text"] for r in records if r["t"] == "reply" and "read_from_text" in r]
    assert [m["dialect"] for m in marked] == ["llama", "llama"]
    ids = [c["id"] for r in records if r["t"] == "message" for c in r["m"].get("tool_calls") or []]
    assert ids == [i for m in marked for i in m["calls"]] and all(i.startswith("call_text_") for i in ids)
    # native stays native: tools sent with every request
    assert all(body["tools"] == FUNCTION_SCHEMAS for body in s.server.requests)


@pytest.mark.cargo
def test_a_cut_or_ambiguous_reply_is_never_half_applied(session: Callable[..., Session]) -> None:
    marker = "HALF OF A CUT REPLY"
    edit, finish = tinyhex_done()
    cut = in_dialect(
        reply(call("write_file", path="src/main.rs", content=marker), call("run_checks")),
        "qwen",
        cut=120,
        finish_reason="length",
    )
    mixed = {
        "role": "assistant",
        "content": '<tool_call>{"name": "write_file", "arguments": {"path": "src/main.rs", "content": "'
        + marker
        + '"}}</tool_call>\n<function=run_checks>{}</function>',
    }
    native_cut = {**reply(call("write_file", path="src/lib.rs", content=marker)), "finish_reason": "length"}
    native_cut["tool_calls"] = [
        native_cut["tool_calls"][0],
        {"id": "c2", "type": "function", "function": {"name": "write_file", "arguments": '{"path": "src/m'}},
    ]
    s = session(
        [cut, mixed, native_cut, in_dialect(edit, "qwen"), in_dialect(finish, "qwen")], tool_format="text", timeout=5.0
    )
    outcome = s.loop.run("print standard input as hex")
    assert outcome.summary == "tinyhex prints its standard input as hex"
    every_version = Git(s.root, ProcessRunner())("log", "-p", "--all")
    assert marker not in every_version and marker not in (s.root / "src" / "lib.rs").read_text()
    told = [m["content"] for m in s.server.requests[3]["messages"] if m["role"] == "user"]
    assert "cut off at the token limit" in told[-4] and "Nothing from this reply was applied" in told[-4]
    assert "mixes two forms" in told[-3] and "<tool_call>" in told[-3]  # the form to use
    # the native calls cut at the token limit: results as user messages (text protocol), none of them ran
    assert told[-2].startswith("Result of write_file:\nnot run:") and "none of its calls ran" in told[-2]
    assert "are not valid JSON" in told[-1] and "token limit" in told[-1]
    assert all("tools" not in body for body in s.server.requests)  # --tool-format text: never sent


@pytest.mark.cargo
def test_auto_switches_to_text_when_the_endpoint_refuses_tools(session: Callable[..., Session]) -> None:
    refused = {
        "fault": "status",
        "status": 400,
        "body": {"error": {"message": '"auto" tool choice requires --enable-auto-tool-choice', "type": "x"}},
    }
    s = session([refused, *(in_dialect(m, "mistral") for m in tinyhex_done())], timeout=5.0)
    s.loop.run("print standard input as hex")
    assert [("tools" in body) for body in s.server.requests] == [True, False, False]
    switched = [e.message for e in s.events if isinstance(e, Notice) and "switching to the text protocol" in e.message]
    assert switched and "HTTP 400" in switched[0]
    assert "- list_files: " in s.server.requests[1]["messages"][0]["content"]
