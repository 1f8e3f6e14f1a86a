"""Tool processes: own process group, parent-death signal, bounded logs, stop by name."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flakebot_magic.clients import lifecycle
from flakebot_magic.clients.lifecycle import LogBuffer, ToolProcess
from flakebot_magic.host.process import scrubbed_env


def _gone(pid: int, within: float = 5.0) -> bool:
    """Wait up to ``within`` seconds for ``pid`` to be gone (or a zombie)."""
    deadline = time.monotonic() + within
    while True:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _pgid(pid: int) -> int:
    return os.getpgid(pid)


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in the process group ``pgid``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[2]) == pgid:
                found.append(int(entry))
    return found


def test_a_tool_process_has_its_own_group_and_logs(tmp_path: Path) -> None:
    logs = LogBuffer()
    script = "echo out; echo err >&2; sleep 30 & wait"
    process = ToolProcess(["sh", "-c", script], env=scrubbed_env(), logs=logs, stdio=False)
    process.start()
    try:
        assert process.alive and process.pid is not None
        assert _pgid(process.pid) == process.pid != os.getpgid(0)
        deadline = time.monotonic() + 5
        while len(logs) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(logs.text().split()) == ["err", "out"]
    finally:
        status = process.stop(grace=0.5)
    assert status == -signal.SIGTERM
    assert not process.alive
    # the `sleep` it started went with it: it was in the same group
    assert _group_members(process.pid) == []


def test_the_log_buffer_is_bounded() -> None:
    logs = LogBuffer(max_lines=3)
    for n in range(10):
        logs.append(f"line {n}\n")
    assert logs.text() == "line 7\nline 8\nline 9\n"
    assert logs.text(last=1) == "line 9\n" and logs.dropped == 7
    logs.append("x" * 10_000)
    assert len(logs.text(last=1)) < 5_000 and "more characters" in logs.text(last=1)


_CHILD = """
import sys, threading, time
from flakebot_magic.clients.lifecycle import LogBuffer, ToolProcess
from flakebot_magic.host.process import scrubbed_env

started = []
def start():  # from a thread that ends at once, as the pipeline's does
    process = ToolProcess(["sleep", "60"], env=scrubbed_env(), logs=LogBuffer(), stdio=True)
    process.start()
    started.append(process)
worker = threading.Thread(target=start)
worker.start()
worker.join()
time.sleep(0.5)
print(started[0].pid, started[0].alive, flush=True)
time.sleep(60)
"""


def test_the_tool_dies_with_the_process_that_started_it_even_by_kill_9() -> None:
    parent = subprocess.Popen([sys.executable, "-c", _CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pid_text, alive = parent.stdout.readline().split()
        tool = int(pid_text)
        # the thread that started it has ended, and it still runs
        assert alive == "True" and not _gone(tool, within=0.2)
        parent.kill()
        parent.wait()
        assert _gone(tool, within=5)
    finally:
        parent.kill()
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()


class _Fake:
    def __init__(self, name: str, home: Path = Path("/cache-one")) -> None:
        self.name = name
        self.home = home
        self.stopped = 0
        self.output = f"{name} output\n"

    def stop(self) -> None:
        self.stopped += 1

    def logs(self, last: int | None = None) -> str:
        return self.output

    @property
    def running(self) -> bool:
        return self.stopped == 0


def test_the_registry_by_home_and_name() -> None:
    home = Path("/cache-one")
    first, second, other = _Fake("lc_a"), _Fake("lc_a"), _Fake("lc_b")
    try:
        lifecycle.register(first)
        lifecycle.register(other)
        assert {"lc_a", "lc_b"} <= set(lifecycle.running(home))
        lifecycle.register(second)  # the same home and name again: the old one is stopped
        assert first.stopped == 1 and second.stopped == 0
        assert lifecycle.logs("lc_a", home) == "lc_a output\n"
        with pytest.raises(KeyError):
            lifecycle.logs("lc_nothing", home)
        assert lifecycle.stop("lc_a", home) is True and second.stopped == 1
        assert lifecycle.stop("lc_a", home) is False  # already stopped
        assert lifecycle.stop("lc_nothing", home) is False
        assert "lc_b" in lifecycle.stop_all() and other.stopped == 1
    finally:
        for fake in (first, second, other):
            lifecycle.unregister(fake)  # type: ignore[arg-type]


def test_two_caches_with_a_tool_of_the_same_name_never_reach_each_others_process(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    (tmp_path / "link").symlink_to(one)
    mine, theirs = _Fake("lc_same", one), _Fake("lc_same", two)
    theirs.output = "the other cache's output\n"
    try:
        lifecycle.register(mine)
        lifecycle.register(theirs)  # registering one never stops the other
        assert mine.stopped == 0 and theirs.stopped == 0
        assert lifecycle.logs("lc_same", one) == "lc_same output\n"
        assert lifecycle.logs("lc_same", two) == "the other cache's output\n"
        assert lifecycle.running(one) == ["lc_same"] == lifecycle.running(two)
        assert lifecycle.stop("lc_same", two) is True
        assert theirs.stopped == 1 and mine.stopped == 0 and lifecycle.running(two) == []
        # the same cache dir named through a symlink is the same home
        assert lifecycle.running(tmp_path / "link") == ["lc_same"]
        assert lifecycle.stop("lc_same", tmp_path / "link") is True and mine.stopped == 1
        with pytest.raises(KeyError):
            lifecycle.logs("lc_same", tmp_path / "elsewhere")
    finally:
        for fake in (mine, theirs):
            lifecycle.unregister(fake)  # type: ignore[arg-type]


_EXIT = """
import sys
from flakebot_magic.clients import lifecycle
from flakebot_magic.clients.lifecycle import LogBuffer, ToolProcess
from flakebot_magic.host.process import scrubbed_env

class Tool:
    name = "t"
    home = "/cache"
    def __init__(self):
        self.process = ToolProcess(["sleep", "60"], env=scrubbed_env(), logs=LogBuffer(), stdio=True)
        self.process.start()
    def stop(self):
        self.process.stop()
    def logs(self, last=None):
        return ""
    @property
    def running(self):
        return self.process.alive

tool = Tool()
lifecycle.register(tool)
print(tool.process.pid, flush=True)
{ending}
"""


@pytest.mark.parametrize("ending", ["pass", "raise KeyboardInterrupt", "sys.exit(3)"])
def test_the_interpreter_stops_its_tools_at_exit(ending: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _EXIT.format(ending=ending)], capture_output=True, text=True, timeout=60
    )
    tool = int(done.stdout.split()[0])
    assert _gone(tool, within=0.5)  # stopped by atexit, not only by the death signal
