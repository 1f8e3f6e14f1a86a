"""One way to start a process: only ``host/process.py`` forks and arms the parent-death signal; one line reader.

* read from the source: no module outside ``flakebot_magic/host/process.py`` calls ``subprocess.Popen`` (or
  ``run``, ``call``, ...), ``os.fork``/``exec*``/``spawn*``/``system``/``popen``, ``pty``, ``asyncio``'s
  subprocesses or ``multiprocessing``, names ``prctl`` (the parent-death signal) or decodes a pipe
  incrementally (the bounded line reader, ``host/output.py``);
* the check is not vacuous: it finds what ``host/process.py`` does, and a module written the old way;
* every door that starts a child gets its own process group and dies with this process: a lasting child by its
  parent-death signal, a call's child (started with vfork, no ``preexec_fn``) by the guard, which SIGKILLs its
  whole group when the parent is SIGKILLed (the runner's door and the exchange's, each tested by killing a real
  parent).
"""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flakebot_magic.host.environment import allowed_env
from flakebot_magic.host.output import LineReader
from flakebot_magic.host.process import spawn

PACKAGE = Path(__file__).resolve().parents[2] / "flakebot_magic"
ENTRY = PACKAGE / "host" / "process.py"
#: the one line reader lives beside the runner
READER = PACKAGE / "host" / "output.py"

_SUBPROCESS = {"Popen", "run", "call", "check_call", "check_output", "getoutput", "getstatusoutput"}
_OS = {"fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp"}
_OS_PREFIXES = ("exec", "spawn")
_MODULES = {"multiprocessing", "pty", "pexpect", "sh", "plumbum"}


def owner_is_os(node: ast.Attribute) -> bool:
    """``os.posix_spawn``: reported once, as a call of ``os``."""
    return isinstance(node.value, ast.Name) and node.value.id == "os"


def _starts(source: str, where: str) -> list[str]:
    """What in ``source`` starts a process, arms a parent-death signal or decodes a pipe by itself."""
    found: list[str] = []
    tree = ast.parse(source)
    types = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Subscript)}  # Popen[bytes]
    for node in ast.walk(tree):
        line = f"{where}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            found += [f"{line} imports {a.name}" for a in node.names if a.name.split(".")[0] in _MODULES]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module.split(".")[0] in _MODULES:
                found.append(f"{line} imports from {module}")
            elif module in ("subprocess", "os"):
                names = _SUBPROCESS if module == "subprocess" else _OS
                found += [
                    f"{line} imports {module}.{a.name}"
                    for a in node.names
                    if a.name in names or (module == "os" and a.name.startswith(_OS_PREFIXES))
                ]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and id(node) not in types:
            owner, attr = node.value.id, node.attr
            if (
                (owner == "subprocess" and attr in _SUBPROCESS)
                or (owner == "os" and (attr in _OS or attr.startswith(_OS_PREFIXES)))
                or (owner == "asyncio" and attr.startswith("create_subprocess"))
            ):
                found.append(f"{line} calls {owner}.{attr}")
        if isinstance(node, (ast.Name, ast.Attribute)):
            name = node.id if isinstance(node, ast.Name) else node.attr
            if name == "prctl":
                found.append(f"{line} names prctl (the parent-death signal)")
            elif name in ("posix_spawn", "posix_spawnp") and not (
                isinstance(node, ast.Attribute) and owner_is_os(node)
            ):
                found.append(f"{line} names {name} (starts a child through the C library)")
            elif name == "getincrementaldecoder":
                found.append(f"{line} decodes a stream by itself (the line reader)")
    return found


#: the unit wrapper runs inside the sandbox, as the stub builds' RUSTC_WRAPPER (never in flakebot's process): it
#: starts rustc and build scripts confined by Landlock, and sets no_new_privs (prctl) for that
SANDBOX_SIDE = PACKAGE / "sandbox" / "unit_wrapper.py"


def _modules() -> list[Path]:
    suites = PACKAGE / "eval" / "suites"  # the eval suites' hidden checks are user-side test code, not flakebot's
    return [p for p in sorted(PACKAGE.rglob("*.py")) if suites not in p.parents and p != SANDBOX_SIDE]


def test_only_host_process_starts_a_child() -> None:
    outside = [
        hit
        for path in _modules()
        if path != ENTRY
        for hit in _starts(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE)))
        if not (path == READER and hit.endswith("(the line reader)"))
    ]
    assert outside == [], "start children through flakebot_magic.host.process (spawn, ProcessRunner):\n" + "\n".join(
        outside
    )


def test_the_check_finds_what_it_forbids() -> None:
    inside = _starts(ENTRY.read_text(encoding="utf-8"), "process.py")
    assert any("subprocess.Popen" in h for h in inside), inside
    assert any("prctl" in h for h in inside), inside
    assert any("posix_spawn (starts a child" in h for h in inside), inside  # start_call's launcher
    assert any("line reader" in h for h in _starts(READER.read_text(encoding="utf-8"), "output.py"))
    old_way = (
        "import subprocess, os\nfrom os import execvp\nimport multiprocessing\n"
        "p = subprocess.Popen(['x'])\nsubprocess.run(['x'])\nos.fork()\nos.spawnlp(0, 'x')\n"
        "lib.prctl(1, 9)\nimport asyncio\nasyncio.create_subprocess_exec('x')\nlibc.posix_spawn(pid, b'x')\n"
    )
    hits = _starts(old_way, "old.py")
    assert len(hits) == 9, hits


#: a child that says which parent-death signal it has armed (``PR_GET_PDEATHSIG``: only one's own can be read)
SHOW_OWN = (
    "import ctypes, sys; v = ctypes.c_int(); ctypes.CDLL(None).prctl(2, ctypes.byref(v), 0, 0, 0); "
    "print(v.value); sys.stdout.flush()"
)


def test_a_lasting_child_has_the_parent_death_signal_and_every_child_its_own_group() -> None:
    proc = spawn(["python3", "-c", SHOW_OWN], env=allowed_env(), lasting=True)
    out, _ = proc.communicate(timeout=30)
    assert int(out) == signal.SIGKILL
    assert proc.returncode == 0
    for lasting in (False, True):
        probe = spawn(["sleep", "30"], env=allowed_env(), lasting=lasting)
        try:
            assert os.getpgid(probe.pid) == probe.pid != os.getpgid(0)
        finally:
            probe.kill()
            probe.wait()
            for pipe in (probe.stdout, probe.stderr):
                assert pipe is not None
                pipe.close()


#: a parent that starts a child through one door; the child starts a grandchild in its group; both print their pids
PARENT = """
import os, sys
from flakebot_magic.host.environment import allowed_env
from flakebot_magic.host.exchange import Exchange
from flakebot_magic.host.process import ProcessRunner, spawn, start_call
child = ["sh", "-c", "sleep 300 & echo $$ $!; wait"]
if sys.argv[1] == "runner":
    def show(stream, line):
        print(line, flush=True)
    ProcessRunner().run(child, env=allowed_env(), timeout=600, on_line=show)
else:
    proc = spawn(child, env=allowed_env(), stdin=True) if sys.argv[1] == "exchange" else start_call(
        ["/bin/sh", *child[1:]], env=allowed_env()
    )
    print(os.read(proc.stdout.fileno(), 100).decode().strip(), flush=True)  # one line, written at once
    Exchange(proc).run(b"", 600)
"""


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("door", ["runner", "exchange", "call"])
def test_a_call_child_and_its_group_die_when_the_parent_is_killed(door: str) -> None:
    """SIGKILL the parent mid-call: the guard kills the child and the grandchild it started."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, door], stdout=subprocess.PIPE, cwd=PACKAGE.parent)
    try:
        assert parent.stdout is not None
        child, grandchild = map(int, parent.stdout.readline().decode().split())
        assert not _gone(child) and not _gone(grandchild)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while not (_gone(child) and _gone(grandchild)) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _gone(child) and _gone(grandchild), "the call's child outlived its parent"
    finally:
        parent.kill()
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()


#: a parent whose guard is killed between two calls: the second call's write finds it dead (EPIPE) and starts
#: another, told of both calls' groups; prints each call's child and grandchild, then the old and new guard
GUARD_KILLED = """
import os, signal, time
from flakebot_magic.host import process
from flakebot_magic.host.environment import allowed_env
child = ["sh", "-c", "sleep 300 & echo $$ $!; wait"]
first = process.spawn(child, env=allowed_env())
print(first.stdout.readline().decode().strip(), flush=True)
old = process._guard._proc
os.kill(old.pid, signal.SIGKILL)
old.wait()
second = process.spawn(child, env=allowed_env())
print(second.stdout.readline().decode().strip(), flush=True)
print(old.pid, process._guard._proc.pid, flush=True)
time.sleep(600)
"""


def test_a_killed_guard_is_replaced_at_the_next_call_and_told_every_group() -> None:
    """No per-call check of the guard: the write itself finds it dead, and the new guard kills both groups."""
    parent = subprocess.Popen([sys.executable, "-c", GUARD_KILLED], stdout=subprocess.PIPE, cwd=PACKAGE.parent)
    try:
        assert parent.stdout is not None
        pids = [int(p) for _ in range(2) for p in parent.stdout.readline().decode().split()]
        old, new = map(int, parent.stdout.readline().decode().split())
        assert old != new and _gone(old) and not _gone(new)
        assert not any(_gone(pid) for pid in pids)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while not all(_gone(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert all(_gone(pid) for pid in pids), "a call's child outlived its parent after the guard was replaced"
    finally:
        parent.kill()
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()


def test_the_guard_is_not_woken_by_a_line() -> None:
    """A call's line costs the guard no wake-up: it sleeps between reads (DRAIN_EVERY), so its CPU time
    stays flat while this process starts hundreds of children, and it still reads every line."""
    from flakebot_magic.host import process
    from flakebot_magic.host.guard import DRAIN_EVERY

    for _ in range(3):
        spawn(["true"], env=allowed_env()).communicate()
    guard = process._guard._proc
    assert guard is not None

    def switches() -> int:
        with open(f"/proc/{guard.pid}/status") as status:
            return sum(int(line.split()[1]) for line in status if "ctxt_switches" in line)

    before, started = switches(), time.monotonic()
    for _ in range(300):
        spawn(["true"], env=allowed_env()).communicate()
    elapsed = time.monotonic() - started
    woken = switches() - before
    # 600 lines; the guard wakes about once per DRAIN_EVERY (plus scheduling noise), not once per line
    assert woken < 20 + 4 * elapsed / DRAIN_EVERY, (woken, elapsed)


def test_a_call_child_is_started_without_a_fork_of_this_process() -> None:
    """vfork: a call's child costs this process far less CPU time to start than a fork of it (200 MB touched)."""
    ballast = bytearray(200 * 1024 * 1024)
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1

    def cpu(start: Callable[[], subprocess.Popen[bytes]]) -> float:
        began = time.process_time()
        for _ in range(40):
            start().communicate()
        return time.process_time() - began

    ours = min(cpu(lambda: spawn(["true"], env=allowed_env())) for _ in range(3))
    forked = min(
        cpu(lambda: subprocess.Popen(["true"], stdout=subprocess.PIPE, preexec_fn=lambda: None)) for _ in range(3)
    )
    assert ours < forked / 2, (ours, forked)
    del ballast


# -- the one line reader: both of its ways with a line too long ------------------------------------------------


def test_the_line_reader_splits_or_drops_a_line_without_end() -> None:
    """Split, the pieces of a long line carry no newline of their own (issue 37, second trial: the fork of the
    crate `cargo` failed, "git recorded another tree than the files", because a newline cut into `git ls-tree -z`'s
    output, one line of 64 KiB and more, renamed the path it fell in)."""
    split: list[str] = []
    reader = LineReader(lambda line, end: split.append(line + end), max_line=10)
    started = time.monotonic()
    for _ in range(1000):
        reader.feed(b"z" * 1000)  # a million bytes, no newline
    reader.feed(b"\nlast", final=True)
    assert time.monotonic() - started < 5
    # pieces of 10, all kept, and nothing added: joined, they are the stream (a long line of data stays data)
    assert split[-1] == "last" and all(piece == "z" * 10 for piece in split[:-2]) and split[-2] == "z" * 10 + "\n"
    assert "".join(split) == "z" * 1_000_000 + "\nlast"
    dropped: list[str] = []
    reader = LineReader(lambda line, end: dropped.append(line + end), max_line=10, split=False)
    for _ in range(1000):
        reader.feed("é".encode() * 500)  # multi-byte: the note counts bytes
    reader.feed(b"\nnext\n", final=True)
    assert dropped == ["é" * 10 + "\n", f"[flakebot: {1_000_000 - 20} more bytes of this line dropped]\n", "next\n"]


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals go to the main thread")
def test_a_lasting_child_whose_caller_is_interrupted_while_it_starts_is_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while the spawner thread starts a server: the caller never gets the Popen, so it is killed then,
    not left running (and unknown) until the kernel exits. The start is held until the interrupt is in."""
    from flakebot_magic.host import process

    interrupted = threading.Event()
    started: list[subprocess.Popen[bytes]] = []
    real = process._spawner.run

    def held(work: Callable[[], subprocess.Popen[bytes]], undo: Callable[[subprocess.Popen[bytes]], None]) -> Any:
        def later() -> subprocess.Popen[bytes]:
            interrupted.wait(30)  # the caller is interrupted first, every time
            started.append(work())
            return started[-1]

        return real(later, undo)

    def on_sigint(signum: int, frame: object) -> None:
        interrupted.set()
        raise KeyboardInterrupt

    monkeypatch.setattr(process._spawner, "run", held)
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        main = threading.main_thread().ident
        assert main is not None
        threading.Timer(0.2, signal.pthread_kill, args=(main, signal.SIGINT)).start()
        with pytest.raises(KeyboardInterrupt):
            spawn(["sleep", "30"], env=allowed_env(), lasting=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert interrupted.is_set() and len(started) == 1
    assert started[0].returncode is not None and _gone(started[0].pid), "the interrupted start left its child running"
