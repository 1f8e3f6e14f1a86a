"""Steering mailboxes: messages from other processes reach the running session once each, in send order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from polling import wait_for

from flakebot_magic.errors import SteeringError, UsageError
from flakebot_magic.host.cache import CacheLayout
from flakebot_magic.records.steering import MAX_MESSAGE_BYTES, Inbox, is_running, running, send, steer_dir

SEND = (
    "import sys\n"
    "from pathlib import Path\n"
    "from flakebot_magic.host.cache import CacheLayout\n"
    "from flakebot_magic.records.steering import send\n"
    "for text in sys.argv[3:]:\n"
    "    send(CacheLayout(Path(sys.argv[1])), sys.argv[2], text, source='cli')\n"
)


def _send_from_another_process(cache: Path, name: str, *texts: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", SEND, str(cache), name, *texts], stderr=subprocess.PIPE)


def _finish(process: subprocess.Popen[bytes]) -> None:
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err.decode()


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_without_a_running_session_send_says_how_to_start_one(tmp_path: Path) -> None:
    with pytest.raises(SteeringError) as caught:
        send(CacheLayout(tmp_path), "md", "also accept --upper")
    assert str(caught.value) == (
        "No edit session of 'md' is running; steering reaches a session while it runs. "
        "Start one with %%flakebot --name md (with a model), or continue it with --resume."
    )
    assert isinstance(caught.value, UsageError)
    assert not (tmp_path / "steer" / "md" / "queue").exists()  # nothing queued for no one


def test_a_message_sent_by_another_process_reaches_the_reader_once(tmp_path: Path) -> None:
    with running(CacheLayout(tmp_path), "md") as inbox:
        assert is_running(CacheLayout(tmp_path), "md")
        _finish(_send_from_another_process(tmp_path, "md", "also accept --upper", "and keep it short"))
        messages = inbox.take()
        assert [(m.text, m.source, m.delivered) for m in messages] == [
            ("also accept --upper", "cli", False),
            ("and keep it short", "cli", False),
        ]
        assert inbox.take() == []
        assert Inbox(CacheLayout(tmp_path), "md").take() == []  # claimed means gone, for every reader
        assert list((steer_dir(CacheLayout(tmp_path), "md") / "queue").iterdir()) == []
    assert not is_running(CacheLayout(tmp_path), "md")
    with pytest.raises(SteeringError, match="No edit session of 'md' is running"):
        send(CacheLayout(tmp_path), "md", "too late")


def test_messages_come_in_send_order_across_processes(tmp_path: Path) -> None:
    with running(CacheLayout(tmp_path), "md") as inbox:
        sent = []
        for index in range(6):  # alternate the senders: this process, another, this, ...
            text = f"message {index}"
            if index % 2:
                _finish(_send_from_another_process(tmp_path, "md", text))
            else:
                send(CacheLayout(tmp_path), "md", text, source="widget")
            sent.append(text)
        assert [m.text for m in inbox.take()] == sent


def test_files_are_private_and_names_sort_in_send_order(tmp_path: Path) -> None:
    with running(CacheLayout(tmp_path), "md"):
        paths = [send(CacheLayout(tmp_path), "md", f"m{i}") for i in range(30)]
    assert paths == sorted(paths, key=lambda p: [int(x) for x in p.name.removesuffix(".json").split("-")])
    assert oct(paths[0].stat().st_mode & 0o777) == "0o600"
    assert oct(steer_dir(CacheLayout(tmp_path), "md").stat().st_mode & 0o777) == "0o700"
    assert json.loads(paths[0].read_text())["text"] == "m0"


def test_two_readers_never_both_get_a_message(tmp_path: Path) -> None:
    per_sender = 60
    with running(CacheLayout(tmp_path), "md"):
        senders = [
            _send_from_another_process(tmp_path, "md", *(f"{who}:{i}" for i in range(per_sender))) for who in "ab"
        ]
        batches: list[list[str]] = []
        lock = threading.Lock()
        stop = threading.Event()

        def read() -> None:
            inbox = Inbox(CacheLayout(tmp_path), "md")
            while not stop.is_set():
                batch = [m.text for m in inbox.take()]
                if batch:
                    with lock:
                        batches.append(batch)

        readers = [threading.Thread(target=read) for _ in range(3)]
        for reader in readers:
            reader.start()
        try:
            for sender in senders:
                _finish(sender)
            wait_for(lambda: sum(map(len, batches)) >= 2 * per_sender, 30, "every message to be taken")
        finally:
            stop.set()
            for reader in readers:
                reader.join()
    got = [text for batch in batches for text in batch]
    assert len(got) == len(set(got)) == 2 * per_sender
    assert set(got) == {f"{who}:{i}" for who in "ab" for i in range(per_sender)}
    for batch in batches:  # within what one take returns, each sender's messages keep their order
        for who in "ab":
            numbers = [int(t.split(":")[1]) for t in batch if t.startswith(who)]
            assert numbers == sorted(numbers)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "empty"),
        ("  \n\t ", "empty"),
        ("x" * (MAX_MESSAGE_BYTES + 1), "the limit is 8,192"),
        ("é" * (MAX_MESSAGE_BYTES // 2 + 1), "the limit is 8,192"),  # bytes, not characters
    ],
)
def test_empty_or_long_messages_are_refused(tmp_path: Path, text: str, problem: str) -> None:
    with running(CacheLayout(tmp_path), "md"), pytest.raises(SteeringError, match=problem):
        send(CacheLayout(tmp_path), "md", text)


def test_a_message_at_the_limit_goes_through(tmp_path: Path) -> None:
    with running(CacheLayout(tmp_path), "md") as inbox:
        send(CacheLayout(tmp_path), "md", "x" * MAX_MESSAGE_BYTES)
        assert [len(m.text) for m in inbox.take()] == [MAX_MESSAGE_BYTES]


@pytest.mark.parametrize("name", ["", "../x", "a/b", ".hidden", "x" * 129, "na me"])
def test_a_bad_tool_name_is_refused_before_any_file_is_touched(tmp_path: Path, name: str) -> None:
    with pytest.raises(UsageError, match="is not a valid tool name"):
        send(CacheLayout(tmp_path), name, "hello")
    with pytest.raises(UsageError, match="is not a valid tool name"):
        Inbox(CacheLayout(tmp_path), name)
    assert list(tmp_path.iterdir()) == []


def test_a_bad_source_is_refused(tmp_path: Path) -> None:
    with running(CacheLayout(tmp_path), "md"), pytest.raises(UsageError, match="steering source"):
        send(CacheLayout(tmp_path), "md", "hi", source="../../etc")


def test_a_marker_whose_process_died_counts_as_not_running(tmp_path: Path) -> None:
    with running(CacheLayout(tmp_path), "md", pid=_dead_pid()):
        assert not is_running(CacheLayout(tmp_path), "md")
        with pytest.raises(SteeringError, match="No edit session"):
            send(CacheLayout(tmp_path), "md", "anyone?")


def test_a_marker_whose_pid_was_reused_counts_as_not_running(tmp_path: Path) -> None:
    markers = steer_dir(CacheLayout(tmp_path), "md") / "running"
    markers.mkdir(parents=True)
    # this process is alive, but it started long after the session the marker describes
    (markers / f"{os.getpid()}-0.json").write_text(json.dumps({"pid": os.getpid(), "started": 1000.0}))
    assert not is_running(CacheLayout(tmp_path), "md")
    assert list(markers.iterdir()) == []  # a stale marker is cleared


def test_a_killed_session_leaves_no_running_session(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from pathlib import Path\n"
            "from flakebot_magic.host.cache import CacheLayout\n"
            "from flakebot_magic.records.steering import running\n"
            "with running(CacheLayout(Path(sys.argv[1])), 'md'):\n"
            "    print('up', flush=True)\n"
            "    time.sleep(60)\n",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"up\n"
        assert is_running(CacheLayout(tmp_path), "md")
        send(CacheLayout(tmp_path), "md", "while it runs")
    finally:
        child.kill()
        child.communicate()
    assert not is_running(CacheLayout(tmp_path), "md")
    with pytest.raises(SteeringError):
        send(CacheLayout(tmp_path), "md", "after the kill")


def test_nested_sessions_keep_the_tool_running_until_the_last_ends(tmp_path: Path) -> None:
    with running(CacheLayout(tmp_path), "md"):
        with running(CacheLayout(tmp_path), "md"):
            send(CacheLayout(tmp_path), "md", "one")
        assert is_running(CacheLayout(tmp_path), "md")
        send(CacheLayout(tmp_path), "md", "two")
    assert not is_running(CacheLayout(tmp_path), "md")


def test_leftovers_are_dropped_at_a_new_session_and_kept_for_a_resumed_one(tmp_path: Path) -> None:
    with running(CacheLayout(tmp_path), "md"):
        send(CacheLayout(tmp_path), "md", "sent as the first session ended")
    with running(CacheLayout(tmp_path), "md", keep_queued=True) as inbox:
        assert [m.text for m in inbox.take()] == ["sent as the first session ended"]
    with running(CacheLayout(tmp_path), "md"):
        send(CacheLayout(tmp_path), "md", "left over again")
    with running(CacheLayout(tmp_path), "md") as inbox:
        assert inbox.take() == []


def test_a_file_that_is_not_a_message_is_dropped(tmp_path: Path) -> None:
    with running(CacheLayout(tmp_path), "md") as inbox:
        good = send(CacheLayout(tmp_path), "md", "good")
        (good.parent / "00000000000000000001-1-0.json").write_text("not json")
        (good.parent / "00000000000000000002-1-0.json").write_text(json.dumps({"text": 5}))
        (good.parent / "notes.txt").write_text("ignored")
        assert [m.text for m in inbox.take()] == ["good"]
        assert sorted(p.name for p in good.parent.iterdir()) == ["notes.txt"]
