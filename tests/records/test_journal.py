"""The session journal: JSON lines that survive kill -9, resume points that follow a chain of resumed sessions."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from polling import wait_for

from flakebot_magic.errors import UsageError
from flakebot_magic.llm.usage import Usage
from flakebot_magic.records import journal as journal_module
from flakebot_magic.records.journal import MAX_RECORD_BYTES, Journal, KnownCheck, journals_dir


def _session(cache: Path, *, end: str | None = None, **start: object) -> Journal:
    journal = Journal.create(cache, "md", request="hex dumps in upper case", base_commit="c0", model="m", **start)
    journal.message({"role": "system", "content": "you edit"})
    journal.message({"role": "user", "content": "hex dumps in upper case"})
    journal.reply(Usage(100, 10, 0, 1))
    journal.check(iteration=1, run=1, commit="c1", tree="t1", green=False, report="error[E0308]")
    if end is not None:
        journal.end(end)  # type: ignore[arg-type]
    else:
        journal.close()
    return journal


def test_records_are_private_json_lines_in_order(tmp_path: Path) -> None:
    journal = Journal.create(
        tmp_path, "md", request="r", follow_up="f", model="m", base_url="http://127.0.0.1:1/v1", candidate=2,
        workspace=tmp_path / "ws", base_commit="c0",
    )  # fmt: skip
    journal.message({"role": "user", "content": "hi"})
    journal.reply(Usage(5, 6, 1, 1))
    journal.check(iteration=0, run=0, commit="c0", tree="t0", green=True, report="all green")
    journal.steer("also accept --upper", "cli")
    journal.end("finished")
    assert journal.path.parent == journals_dir(tmp_path, "md")
    assert stat.S_IMODE(journal.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(journal.path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "journals").stat().st_mode) == 0o700
    lines = journal.path.read_bytes().split(b"\n")
    assert lines[-1] == b""
    records = [json.loads(line) for line in lines[:-1]]
    assert [r["t"] for r in records] == ["start", "message", "reply", "check", "steer", "end"]
    start = records[0]
    assert {k: start[k] for k in ("request", "follow_up", "model", "base_url", "candidate", "base_commit")} == {
        "request": "r",
        "follow_up": "f",
        "model": "m",
        "base_url": "http://127.0.0.1:1/v1",
        "candidate": 2,
        "base_commit": "c0",
    }
    assert start["workspace"] == str(tmp_path / "ws") and start["resumes"] is None
    assert records[1]["m"] == {"role": "user", "content": "hi"}
    assert records[2]["usage"]["prompt_tokens"] == 5
    assert records[5]["status"] == "finished"
    assert all(isinstance(r["at"], float) for r in records)
    assert Journal.read(journal.path) == records
    assert Journal.last_unfinished(tmp_path, "md") is None  # it finished: nothing to resume
    with pytest.raises(ValueError, match="closed"):
        journal.message({"role": "user", "content": "after the end"})


def test_an_unfinished_session_is_a_resume_point(tmp_path: Path) -> None:
    journal = _session(tmp_path)
    point = Journal.last_unfinished(tmp_path, "md")
    assert point is not None
    assert point.path == journal.path and point.session == journal.session and point.chain == [journal.path]
    assert point.start["request"] == "hex dumps in upper case"
    assert point.messages == [
        {"role": "system", "content": "you edit"},
        {"role": "user", "content": "hex dumps in upper case"},
    ]
    assert point.last_commit == "c1"
    assert point.checks_by_tree == {"t1": KnownCheck("error[E0308]", False, "c1", 1, 1)}
    assert (point.iterations, point.runs) == (1, 1)
    assert point.usage == Usage(100, 10, 0, 1)
    assert point.status is None


@pytest.mark.parametrize("status", ["failed", "cancelled", "budget"])
def test_a_session_that_ended_short_of_finished_can_be_resumed(tmp_path: Path, status: str) -> None:
    journal = _session(tmp_path, end=status)
    point = Journal.last_unfinished(tmp_path, "md")
    assert point is not None and point.session == journal.session and point.status == status


def test_before_any_check_the_last_commit_is_the_base_commit(tmp_path: Path) -> None:
    Journal.create(tmp_path, "md", request="r", base_commit="base").close()
    point = Journal.last_unfinished(tmp_path, "md")
    assert point is not None and point.last_commit == "base" and point.messages == []


def test_no_journal_no_resume_point(tmp_path: Path) -> None:
    assert Journal.last_unfinished(tmp_path, "md") is None


WRITER = """
import sys
from flakebot_magic.records.journal import Journal
journal = Journal.create(sys.argv[1], "md", request="r", base_commit="c0")
print(journal.path, flush=True)
index = 0
while True:
    journal.message({"role": "tool", "tool_call_id": f"call_{index}", "content": f"{index}:" + "x" * 200_000})
    index += 1
"""


def test_a_journal_killed_mid_stream_reads_back_to_its_last_whole_record(tmp_path: Path) -> None:
    # Linux rarely tears one write() to a regular file on SIGKILL; test_a_torn_last_line_is_skipped tears one for sure
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE)
    try:
        assert writer.stdout is not None
        path = Path(writer.stdout.readline().decode().strip())
        wait_for(lambda: path.read_bytes().count(b"\n") >= 8, 60, "eight records in the journal")
        os.kill(writer.pid, signal.SIGKILL)
    finally:
        writer.kill()
        writer.communicate()
    assert writer.returncode == -signal.SIGKILL
    whole_lines = path.read_bytes().count(b"\n")
    point = Journal.last_unfinished(tmp_path, "md")
    assert point is not None and point.status is None
    assert len(point.messages) == whole_lines - 1  # every whole line but the start is a message
    assert [m["tool_call_id"] for m in point.messages] == [f"call_{i}" for i in range(len(point.messages))]
    assert all(m["content"].startswith(f"{i}:") for i, m in enumerate(point.messages))


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    journal = _session(tmp_path)
    journal_bytes = journal.path.read_bytes()
    journal.path.write_bytes(journal_bytes[:-7])  # the check record, cut as a crash mid-write would
    point = Journal.last_unfinished(tmp_path, "md")
    assert point is not None
    assert len(point.messages) == 2 and point.checks_by_tree == {} and point.last_commit == "c0"
    assert point.usage == Usage(100, 10, 0, 1)


def test_a_journal_torn_at_its_creation_is_passed_over(tmp_path: Path) -> None:
    first = _session(tmp_path)
    torn = Journal.create(tmp_path, "md", request="r2")
    torn.close()
    torn.path.write_bytes(torn.path.read_bytes()[:10])
    point = Journal.last_unfinished(tmp_path, "md")
    assert point is not None and point.session == first.session


def test_resuming_twice_carries_the_whole_conversation(tmp_path: Path) -> None:
    first = _session(tmp_path)  # killed: no end
    point = Journal.last_unfinished(tmp_path, "md")
    assert point is not None
    second = Journal.create(tmp_path, "md", request="hex dumps in upper case", base_commit="c1", resumes=point)
    second.message({"role": "assistant", "content": "continuing"})
    second.reply({"prompt_tokens": 50, "completion_tokens": 5})
    second.check(iteration=2, run=3, commit="c2", tree="t2", green=False, report="1 test failed")
    second.steer("also accept --upper", "widget")
    second.close()  # killed again
    point = Journal.last_unfinished(tmp_path, "md")
    assert point is not None and point.session == second.session
    third = Journal.create(tmp_path, "md", request="hex dumps in upper case", base_commit="c2", resumes=point)
    third.message({"role": "tool", "tool_call_id": "x", "content": "green"})
    third.check(iteration=3, run=4, commit="c3", tree="t3", green=True, report="green")
    third.end("budget")
    point = Journal.last_unfinished(tmp_path, "md")
    assert point is not None
    assert point.session == third.session and point.status == "budget"
    assert point.chain == [first.path, second.path, third.path]
    assert [m["content"] for m in point.messages] == ["you edit", "hex dumps in upper case", "continuing", "green"]
    assert set(point.checks_by_tree) == {"t1", "t2", "t3"} and point.checks_by_tree["t3"].green
    assert point.last_commit == "c3" and (point.iterations, point.runs) == (3, 4)
    assert point.usage == Usage(150, 15, 0, 2)
    assert point.steers == [{"text": "also accept --upper", "source": "widget"}]
    assert point.start["base_commit"] == "c0"  # the first session's start: the work's base
    assert Journal.read(third.path)[0]["resumes"] == second.session
    assert Journal.read(third.path)[0]["run"] == Journal.read(first.path)[0]["run"]
    fourth = Journal.create(tmp_path, "md", request="hex dumps in upper case", resumes=point)
    fourth.end("finished")
    assert Journal.last_unfinished(tmp_path, "md") is None


def test_a_newer_build_supersedes_an_older_unfinished_one(tmp_path: Path) -> None:
    _session(tmp_path)
    newer = _session(tmp_path)
    point = Journal.last_unfinished(tmp_path, "md")
    assert point is not None and point.session == newer.session and point.chain == [newer.path]
    _session(tmp_path, end="finished")
    assert Journal.last_unfinished(tmp_path, "md") is None


def test_candidates_of_one_build_count_together(tmp_path: Path) -> None:
    winner = _session(tmp_path, run="build-1", candidate=0, end="finished")
    _session(tmp_path, run="build-1", candidate=1, end="cancelled")  # the loser, stopped after the winner
    assert Journal.last_unfinished(tmp_path, "md") is None
    _session(tmp_path, run="build-2", candidate=0, end="failed")
    second = _session(tmp_path, run="build-2", candidate=1)
    point = Journal.last_unfinished(tmp_path, "md")
    assert point is not None and point.session == second.session and point.start["candidate"] == 1
    assert winner.path.exists()


def test_a_huge_message_is_stored_capped_and_marked(tmp_path: Path) -> None:
    journal = Journal.create(tmp_path, "md", request="r")
    output = "running 1 test\n" + "y" * 1_000_000 + "\ntest result: FAILED"
    journal.message({"role": "tool", "tool_call_id": "c1", "content": output})
    journal.message({"role": "tool", "tool_call_id": "c2", "content": "\x01" * 300_000})  # escapes to 6 bytes a char
    journal.message({"role": "user", "content": "small"})
    journal.close()
    lines = journal.path.read_bytes().split(b"\n")[:-1]
    assert all(len(line) <= MAX_RECORD_BYTES + 100 for line in lines)
    records = Journal.read(journal.path)
    assert records[1]["capped"] is True and records[2]["capped"] is True and "capped" not in records[3]
    content = records[1]["m"]["content"]
    assert content.startswith("running 1 test\nyyy") and content.endswith("yyy\ntest result: FAILED")
    assert "bytes cut from the middle" in content
    point = Journal.last_unfinished(tmp_path, "md")
    assert point is not None and point.capped
    assert [m["tool_call_id"] for m in point.messages[:2]] == ["c1", "c2"]


def test_undecodable_bytes_kept_by_surrogateescape_survive(tmp_path: Path) -> None:
    text = b"caf\xe9 \xff".decode("utf-8", errors="surrogateescape")
    journal = Journal.create(tmp_path, "md", request="r")
    journal.message({"role": "tool", "tool_call_id": "c", "content": text})
    journal.close()
    point = Journal.last_unfinished(tmp_path, "md")
    assert point is not None and point.messages[0]["content"] == text


def test_old_journals_are_pruned_but_never_a_chain_being_resumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journal_module, "KEEP_JOURNALS", 3)
    oldest = _session(tmp_path)
    point = Journal.last_unfinished(tmp_path, "md")
    assert point is not None
    chain = [oldest]
    for _ in range(4):  # resumed again and again: the chain grows past what is kept
        journal = Journal.create(tmp_path, "md", request="r", resumes=point)
        journal.close()
        chain.append(journal)
        point = Journal.last_unfinished(tmp_path, "md")
        assert point is not None
    assert point.chain == [j.path for j in chain]
    for _ in range(3):  # then fresh builds: the old chain may go
        _session(tmp_path, end="finished")
    remaining = sorted(journals_dir(tmp_path, "md").iterdir())
    assert len(remaining) == 3 and not oldest.path.exists()


def test_bad_names_and_statuses_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not a valid tool name"):
        Journal.create(tmp_path, "../md", request="r")
    journal = Journal.create(tmp_path, "md", request="r")
    with pytest.raises(ValueError, match="unknown end status"):
        journal.end("done")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a session id"):
        Journal.create(tmp_path, "md", request="r", resumes="../../etc/passwd")
    journal.close()
