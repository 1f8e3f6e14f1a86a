"""A client never changes its behaviour silently (issue 34): a ``--help`` probe that gets no answer is asked again or
refused, never taken for "reads no standard input"; an entry that cannot be read is an error, never ``''``.

The probe decides how a call passes its input: a tool whose help says it
reads standard input gets a first plain ``str`` there, any other gets it as
an argument. A probe killed once used to read as "no help", and the client
then passed the input as an argument for the rest of its life. Here a
watcher kills the probe (the tool inside the sandbox, or the sandbox itself)
the first time, or every time; and a real built tool's store entry is made
unreadable (mode 000, as root: root's reads ignore it, the sandbox's do not).
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tinycrates import write_registry

from flakebot_magic import load
from flakebot_magic.cli import main
from flakebot_magic.clients.cli_tool import CliTool
from flakebot_magic.config import Settings
from flakebot_magic.errors import CacheFileDamaged, ToolError
from flakebot_magic.pipeline.background import start_build
from flakebot_magic.records.inventory import Inventory
from flakebot_magic.request import BuildRequest

#: a tool that shouts standard input, and says so in its help (slowly: a watcher has time to kill the probe)
SHOUT = """#!/bin/sh
if [ "$1" = "--help" ]; then
  sleep 1
  echo "Usage: shout"
  echo "Reads standard input and prints it in upper case."
  exit 0
fi
if [ $# -gt 0 ]; then echo "ARGUMENTS: $*"; exit 0; fi
tr a-z A-Z
"""


class Killer:
    """Kills the probe of ``script`` (``--help``): its sandboxed process (``tool``) or the sandbox around it
    (``sandbox``), the first ``times`` times it starts."""

    def __init__(self, script: Path, target: str, times: int) -> None:
        self.script, self.target, self.left = str(script), target, times
        self.killed: list[int] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _probes(self) -> list[int]:
        found = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) in self.killed:
                continue
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if self.script.encode() in argv and b"--help" in argv:
                sandbox = os.path.basename(argv[0]) == b"bwrap"
                if sandbox == (self.target == "sandbox") and not (sandbox and not self._ours(pid)):
                    found.append(int(pid))
        return found

    @staticmethod
    def _ours(pid: str) -> bool:
        """Whether this process started ``pid`` (the sandbox forks: the process the client started is killed)."""
        try:
            return int(Path(f"/proc/{pid}/status").read_text().split("PPid:")[1].split()[0]) == os.getpid()
        except (OSError, IndexError, ValueError):
            return False

    def _watch(self) -> None:
        while self.left and not self.done.is_set():
            for pid in self._probes():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
                self.killed.append(pid)
                self.left -= 1
                break
            time.sleep(0.02)

    def stop(self) -> None:
        self.done.set()
        self.thread.join(5)


@pytest.fixture
def shout(tmp_path: Path) -> Iterator[CliTool]:
    store = tmp_path / "store"
    store.mkdir()
    script = store / "shout"
    script.write_text(SHOUT)
    script.chmod(0o755)
    yield CliTool(name="shout", binary=script, crate="shout", version="1", source_hash="0", store_path=store)


@pytest.mark.parametrize("target", ["tool", "sandbox"])
def test_a_probe_killed_once_is_asked_again_and_the_call_goes_to_standard_input(shout: CliTool, target: str) -> None:
    killer = Killer(shout.binary, target, times=1)
    try:
        assert shout("hi") == "HI"  # standard input, as its help says: never "ARGUMENTS: hi"
    finally:
        killer.stop()
    assert len(killer.killed) == 1, "the first probe was killed"
    assert shout.reads_stdin


@pytest.mark.parametrize("target", ["tool", "sandbox"])
def test_a_probe_killed_every_time_is_refused_with_a_clear_error_and_asked_again_later(
    shout: CliTool, target: str
) -> None:
    killer = Killer(shout.binary, target, times=2)
    try:
        with pytest.raises(ToolError) as caught:
            shout("hi")
    finally:
        killer.stop()
    message = str(caught.value)
    assert "shout was not run" in message and "was killed (SIGKILL)" in message and "twice" in message, message
    assert "flakebot doctor" in message, message
    assert shout("hi") == "HI"  # nothing was kept of the failure: the next call asks again, and is right


# -- a real tool whose store entry cannot be read -------------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("unreadable")
    registry = write_registry(root / "registry", ["tinyecho"])
    settings = Settings(cache_dir=root / "built", registry=str(registry), backend="cargo")
    start_build(settings, BuildRequest("", name="te", crate="tinyecho")).wait()
    yield settings.cache_dir


@pytest.mark.cargo
@pytest.mark.parametrize("part", ["entry", "binary", "bin"])
def test_an_unreadable_store_entry_is_an_error_and_doctor_gives_it_back(
    built: Path, tmp_path: Path, part: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(built, cache, symlinks=True)
    record = Inventory(Settings(cache_dir=cache).cache.tools).get("te")
    assert record is not None
    entry, binary = Path(record.store_path), Path(record.binary)
    te = load("te", cache_dir=str(cache))  # loaded while it was whole, as in a kernel before the damage
    {"entry": entry, "binary": binary, "bin": binary.parent}[part].chmod(0)
    for call in (lambda: te("hi"), lambda: load("te", cache_dir=str(cache))("hi")):
        with pytest.raises((ToolError, CacheFileDamaged)) as caught:  # never '' nor "hi\n" (the argument echoed)
            call()
        message = str(caught.value)
        assert "cannot run" in message and "its mode is 000" in message and "flakebot doctor" in message, message
    capsys.readouterr()
    assert main(["doctor", "--cache-dir", str(cache)]) == 0  # it gave the modes back: no problem is left
    out = capsys.readouterr().out
    assert "gave their owner back the reading and running of" in out and "(they are whole)" in out, out
    assert te("hi") == "HI" and load("te", cache_dir=str(cache))("hi") == "HI"
