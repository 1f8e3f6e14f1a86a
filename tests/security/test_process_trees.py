"""Process trees and output: time limits hold against setsid grandchildren, children die with flakebot, output is bounded."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from polling import wait_for
from tinycrates import processes_in

from flakebot_magic.config import Settings
from flakebot_magic.errors import StageTimeout
from flakebot_magic.host.crashpoints import ENV as CRASH_ENV
from flakebot_magic.host.crashpoints import POINTS
from flakebot_magic.host.process import ProcessRunner, allowed_env, kill_tree, process_started_at, scrubbed_env
from flakebot_magic.manage.tools import stop
from flakebot_magic.records.inventory import Inventory, ToolRecord


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_setsid_grandchild_holding_the_pipe_does_not_stretch_the_time_limit(tmp_path: Path) -> None:
    # the grandchild leaves the process group (setsid) but keeps stdout: before, a 5 s limit took 20 s
    script = "setsid sleep 100 & sleep 60"
    started = time.monotonic()
    with pytest.raises(StageTimeout):
        ProcessRunner().run(["sh", "-c", script], cwd=tmp_path, timeout=2)
    assert time.monotonic() - started < 5
    assert processes_in(tmp_path) == []  # the grandchild, too, was killed


def test_an_exited_command_leaves_nothing_behind(tmp_path: Path) -> None:
    # the leader exits at once; one straggler stays in its group, another leaves it holding the pipe
    script = "sleep 100 & setsid sleep 100 & echo done"
    started = time.monotonic()
    done = ProcessRunner().run(["sh", "-c", script], cwd=tmp_path, timeout=30)
    assert done.returncode == 0 and done.stdout == "done\n"
    assert time.monotonic() - started < 5
    assert processes_in(tmp_path) == []


def test_children_die_with_flakebot(tmp_path: Path) -> None:
    # a stand-in kernel starts a command through the runner, then is killed with SIGKILL
    marker = tmp_path / "child.pid"
    kernel = textwrap.dedent(f"""
        from flakebot_magic.host.process import ProcessRunner
        ProcessRunner().run(["sh", "-c", "echo $$ > {marker}; exec sleep 100"], timeout=100)
    """)
    proc = subprocess.Popen([sys.executable, "-c", kernel], cwd=tmp_path, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while not (marker.exists() and marker.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        child = int(marker.read_text())
        assert _alive(child)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 5
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the runner's child outlived its parent (no parent-death signal)"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


#: a stand-in kernel that starts a command through one door (the runner: no input; a call: input on a pipe)
KILLED_AT = """
import sys
from flakebot_magic.host.environment import allowed_env
from flakebot_magic.host.process import ProcessRunner, spawn
command = ["sh", "-c", "echo ran > ran; exec sleep 100"]
if sys.argv[1] == "runner":
    ProcessRunner().run(command, timeout=100)
else:
    spawn(command, env=allowed_env(), stdin=True).wait()
"""


@pytest.mark.parametrize("door", ["runner", "call"])
@pytest.mark.parametrize("point", sorted(p for p in POINTS if p.startswith("spawn.")))
def test_a_parent_killed_while_it_starts_a_child_leaves_nothing(tmp_path: Path, point: str, door: str) -> None:
    """The window between a child's start and the guard knowing it, hit every time: the parent SIGKILLs itself
    there (a crash point). The child waits at its gate until the guard knows it, so it never ran, and nothing
    of it is left."""
    env = {**os.environ, CRASH_ENV: point}
    proc = subprocess.run([sys.executable, "-c", KILLED_AT, door], cwd=tmp_path, env=env, timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the parent did not die at the crash point"
    assert processes_in(tmp_path) == [], f"a child outlived a parent killed at {point}"
    assert not (tmp_path / "ran").exists(), "the command ran before the guard knew it"


#: a stand-in kernel that starts a CLI call's child by posix_spawn (no gate: it runs at once) and is killed before
#: the guard is told its group; the child starts a grandchild in its group and one that leaves it by setsid
KILLED_IN_CALL = """
from flakebot_magic.host.environment import allowed_env
from flakebot_magic.host.process import CallProcess, start_call
command = ["/bin/sh", "-c", "setsid sleep 100 & sleep 100 & echo ran > ran; exec sleep 100"]
proc = start_call(command, env=allowed_env())
assert isinstance(proc, CallProcess), "start_call fell back to Popen: no posix_spawn door here"
proc.wait()
"""


def test_a_parent_killed_after_a_calls_start_leaves_nothing_of_it(tmp_path: Path) -> None:
    """A CLI call's child has no gate (a shell's exec would double the call's cost): killed before it registers
    the child, the parent leaves a child that may have run, and the guard finds it, and what it started (in its
    group or not), by the mark in their environment."""
    env = {**os.environ, CRASH_ENV: "call.started"}
    proc = subprocess.run([sys.executable, "-c", KILLED_IN_CALL], cwd=tmp_path, env=env, timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the parent did not die at the crash point"
    assert processes_in(tmp_path) == [], "a call's child outlived a parent killed before the guard knew its group"


def test_a_line_without_end_is_not_held_in_memory() -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    printer = "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(300): sys.stdout.write(chunk)\n"
    pieces: list[int] = []
    done = ProcessRunner().run(
        [sys.executable, "-c", printer],
        timeout=120,
        capture_limit=4 << 20,
        on_line=lambda stream, line: pieces.append(len(line)),
    )
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert done.returncode == 0
    assert done.stdout.endswith("[flakebot: output truncated after 4 MiB]\n")
    assert len(done.stdout) < 5 << 20
    assert max(pieces) <= 64 * 1024  # observers see pieces, never the 300 MB line
    assert grown < 100 * 1024, f"the runner grew by {grown // 1024} MiB reading 300 MB"


def test_kill_tree_ends_the_whole_group(tmp_path: Path) -> None:
    proc = subprocess.Popen(["sh", "-c", "sleep 100 & sleep 100 & wait"], cwd=tmp_path, start_new_session=True)
    wait_for(lambda: len(processes_in(tmp_path, settle=0)) == 3, 10, "sh and its two sleeps to start")
    kill_tree(proc.pid, grace=0.5)
    proc.wait(timeout=5)
    assert processes_in(tmp_path) == []
    kill_tree(proc.pid)  # a group that is gone: nothing happens
    with pytest.raises(ValueError):
        kill_tree(1)


def test_stop_never_kills_a_process_that_reused_the_recorded_pid(tmp_path: Path) -> None:
    settings = Settings(cache_dir=tmp_path / "cache")
    # an unrelated process group that happens to have the PID a stale record names
    bystander = subprocess.Popen(["sleep", "100"], start_new_session=True)
    try:
        started = process_started_at(bystander.pid)
        assert started is not None and abs(started - time.time()) < 5
        record = ToolRecord(
            name="svc",
            crate="c",
            version="0.1.0",
            binary="",
            store_path="",
            source_hash="",
            checksum="",
            checksum_kind="",
            registry="",
            workspace="",
            commit="",
            kind="http",
            status="running",
            pid=bystander.pid,
            started=time.time() - 3600,  # the tool started an hour ago; this PID just now
        )
        Inventory(settings.cache.tools).save(record)
        said = stop(settings, "svc")
        assert "not running" in said and "another process" in said
        time.sleep(0.2)
        assert bystander.poll() is None, "stop killed an unrelated process that reused the PID"
        assert Inventory(settings.cache.tools).get("svc").status == "stopped"  # type: ignore[union-attr]
    finally:
        bystander.kill()
        bystander.wait()


def test_no_secret_passes_either_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    canary = uuid.uuid4().hex
    secrets = (
        "CANARY_API_KEY",
        "SECRET_KEY",
        "DATABASE_URL",
        "PGPASSWORD",
        "SSH_AUTH_SOCK",
        "AZURE_OPENAI_KEY",
        "KAGGLE_KEY",
        "OPENAI_API_KEY",
        "GH_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "JUPYTER_TOKEN",
    )
    for name in secrets:
        monkeypatch.setenv(name, f"{name}-{canary}")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    strict = allowed_env({"CARGO_HOME": "/private"}, home="/empty")
    helper = scrubbed_env({"GIT_AUTHOR_NAME": "flakebot"})
    for env in (strict, helper):
        assert canary not in repr(env)
        assert env["LC_ALL"] == "C.UTF-8" and "PATH" in env
    assert strict["HOME"] == "/empty" and strict["CARGO_HOME"] == "/private"
    assert helper["HOME"] == os.environ["HOME"] and helper["GIT_AUTHOR_NAME"] == "flakebot"
    done = ProcessRunner().run(["env"], env=helper, timeout=30)
    assert canary not in done.stdout
