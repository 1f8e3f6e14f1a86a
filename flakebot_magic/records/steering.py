"""Steering a running edit session: a mailbox per tool in the cache that any process on the machine may write to.

``flakebot steer NAME "also accept --upper"``, the REST API and the widget all
call :func:`send`; the running session reads the messages with
:class:`Inbox` (``take`` before each model request) and hands them to the
model as user messages. The layout, in the private cache::

    <cache>/steer/<name>/running/<pid>-<token>.json   one marker per running session (pid, start time)
    <cache>/steer/<name>/queue/<clock>-<pid>-<n>.json  one file per message, written atomically
    <cache>/steer/<name>/taken/                        a message being read, moved here by the one reader that won it

A message file is named by the machine's monotonic clock, the sender's pid
and a per-process counter, so names sort in send order; a reader claims a
message by renaming it out of ``queue/`` (one rename wins, so two readers
never both get one message). A session marks itself running with
:func:`running`; a marker whose process is gone (or whose pid now belongs to
another process) does not count, so :func:`send` refuses a message no one
would read, with an error that says how to start or resume a session.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import SteeringError, UsageError
from ..events import SteeringMessage
from ..host.cache import CacheLayout
from ..host.fsutil import atomic_write, load_json, private_dir, read_regular
from ..host.names import check_tool_name
from ..host.process import alive, process_started_at

__all__ = ["MAX_MESSAGE_BYTES", "Inbox", "is_running", "running", "send", "steer_dir"]

#: the longest steering message, in UTF-8 bytes: a sentence or a paragraph, not a document
MAX_MESSAGE_BYTES = 8 * 1024
#: what a message file may hold at most (the text, JSON-escaped, and a few fields)
_MAX_FILE_BYTES = 8 * MAX_MESSAGE_BYTES
_SOURCE = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,31}")
_MESSAGE_FILE = re.compile(r"\d{20}-\d+-\d+\.json")
_counter = itertools.count()
_counter_lock = threading.Lock()


def steer_dir(cache: CacheLayout, name: str) -> Path:
    """``<cache>/steer/<name>``: tool ``name``'s mailbox (not created here)."""
    return cache.steer / check_tool_name(name)


def _private_box(cache: CacheLayout, name: str, folder: str) -> Path:
    """``<cache>/steer/<name>/<folder>``, each level a directory only its owner can enter."""
    steer = cache.create().steer
    return private_dir(private_dir(steer / check_tool_name(name)) / folder)


def _markers(box: Path) -> list[Path]:
    try:
        return [entry for entry in (box / "running").iterdir() if entry.name.endswith(".json")]
    except (FileNotFoundError, NotADirectoryError):
        return []


def _marker_alive(marker: Path) -> bool | None:
    """True when the marker's process still runs, False when it is gone, None when the marker cannot be read."""
    try:
        data, _ = read_regular(marker, 4096)
        record = load_json(data)
        pid, started = int(record["pid"]), float(record["started"])
    except FileNotFoundError:
        return False
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not alive(pid):
        return False
    now_started = process_started_at(pid)
    # a pid reused by a process that started after the marker was written is not the session
    return now_started is None or now_started <= started + 2.0


def is_running(cache: CacheLayout, name: str) -> bool:
    """Whether an edit session of tool ``name`` is running (on this machine) and reading its mailbox."""
    box = steer_dir(cache, name)
    running_now = False
    for marker in _markers(box):
        state = _marker_alive(marker)
        if state:
            running_now = True
        elif state is False:  # its session died without removing it (kill -9): clear it for the next look
            marker.unlink(missing_ok=True)
    return running_now


def send(cache: CacheLayout, name: str, text: str, *, source: str = "cli") -> Path:
    """Queue ``text`` for the running edit session of tool ``name``; return the message's file.

    ``source`` says who sent it (``"cli"``, ``"api"``, ``"widget"``). Raises
    :class:`~flakebot_magic.errors.SteeringError` for empty text, text over
    :data:`MAX_MESSAGE_BYTES`, or when no session of ``name`` is running;
    :class:`~flakebot_magic.errors.UsageError` for a bad tool name.
    """
    check_tool_name(name)
    if not isinstance(text, str) or not text.strip():
        raise SteeringError("The steering message is empty. Say what the model should do differently.")
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size > MAX_MESSAGE_BYTES:
        raise SteeringError(
            f"The steering message has {size:,} bytes; the limit is {MAX_MESSAGE_BYTES:,}. "
            "Say it in a paragraph; put long material in a file of the workspace and name it."
        )
    if not isinstance(source, str) or not _SOURCE.fullmatch(source):
        raise UsageError(f"The steering source {source!r} is not a short name like 'cli', 'api' or 'widget'.")
    if not is_running(cache, name):
        raise SteeringError(
            f"No edit session of {name!r} is running; steering reaches a session while it runs. "
            f"Start one with %%flakebot --name {name} (with a model), or continue it with --resume."
        )
    queue = _private_box(cache, name, "queue")
    with _counter_lock:
        number = next(_counter)
    path = queue / f"{time.monotonic_ns():020d}-{os.getpid()}-{number}.json"
    body = {"text": text, "source": source, "sent_at": time.time(), "pid": os.getpid()}
    atomic_write(path, json.dumps(body, ensure_ascii=False), root=cache.root)
    return path


def _send_order(entry: Path) -> tuple[int, int, int]:
    clock, pid, number = entry.name.removesuffix(".json").split("-")
    return int(clock), int(pid), int(number)


class Inbox:
    """Tool ``name``'s steering messages, for the session that reads them.

    :meth:`take` claims every queued message once, oldest first; with several
    readers (in any processes), each message goes to exactly one of them.
    """

    def __init__(self, cache: CacheLayout, name: str) -> None:
        self.cache = cache
        self.name = check_tool_name(name)
        self.box = steer_dir(cache, name)
        self._token = secrets.token_hex(6)

    def take(self) -> list[SteeringMessage]:
        """The messages queued since the last ``take`` (by any reader), in send order; each removed from the queue."""
        queue = self.box / "queue"
        try:
            names = [entry for entry in queue.iterdir() if _MESSAGE_FILE.fullmatch(entry.name)]
        except (FileNotFoundError, NotADirectoryError):
            return []
        taken = _private_box(self.cache, self.name, "taken")
        messages: list[SteeringMessage] = []
        for entry in sorted(names, key=_send_order):
            claimed = taken / f"{entry.name}.{self._token}"
            try:
                os.rename(entry, claimed)  # atomic: of two readers, one wins, the other finds it gone
            except FileNotFoundError:
                continue
            message = self._read(claimed)
            claimed.unlink(missing_ok=True)
            if message is not None:
                messages.append(message)
        return messages

    @staticmethod
    def _read(path: Path) -> SteeringMessage | None:
        """A claimed message, or None for a file that is not one (it is dropped)."""
        try:
            data, cut = read_regular(path, _MAX_FILE_BYTES)
            record: Any = None if cut else load_json(data)
        except (OSError, ValueError):
            return None
        if not isinstance(record, dict):
            return None
        text, source = record.get("text"), record.get("source")
        if not isinstance(text, str) or not text.strip() or not isinstance(source, str):
            return None
        return SteeringMessage(text=text, source=source[:32])

    def discard(self) -> int:
        """Drop every queued message unread (and any a dead reader left half-taken); return how many."""
        dropped = 0
        for folder in ("queue", "taken"):
            try:
                entries = list((self.box / folder).iterdir())
            except (FileNotFoundError, NotADirectoryError):
                continue
            for entry in entries:
                if entry.name.startswith("."):  # a sender's temporary file, about to become a message
                    continue
                try:
                    entry.unlink()
                    dropped += 1
                except (FileNotFoundError, IsADirectoryError):
                    pass
        return dropped


@contextmanager
def running(cache: CacheLayout, name: str, pid: int | None = None, *, keep_queued: bool = False) -> Iterator[Inbox]:
    """Mark an edit session of tool ``name`` as running for the ``with`` block; yield its :class:`Inbox`.

    While the block runs (and process ``pid`` lives; default: this one),
    :func:`send` accepts messages for ``name``. Messages left from an earlier
    session (queued just as it ended) are dropped when the block starts,
    unless ``keep_queued`` (a resumed session reads what was sent to the one
    it continues) or another session of ``name`` is running.
    """
    pid = os.getpid() if pid is None else pid
    inbox = Inbox(cache, name)
    if not keep_queued and not is_running(cache, name):
        inbox.discard()
    markers = _private_box(cache, name, "running")
    marker = markers / f"{pid}-{secrets.token_hex(6)}.json"
    started = process_started_at(pid)
    record = {"pid": pid, "started": started if started is not None else 0.0, "at": time.time()}
    atomic_write(marker, json.dumps(record), root=cache.root)
    try:
        yield inbox
    finally:
        marker.unlink(missing_ok=True)
