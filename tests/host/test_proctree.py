"""host/proctree.py: a finished command's leftovers ended, proven gone without reading every process."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tinycrates import processes_in

from flakebot_magic.host.process import ProcessRunner

#: the directories this process listed while :data:`_WATCHING` holds True (an audit hook: observed, not replaced;
#: its own module, so no other test shares the process it is installed in)
_LISTED: list[str] = []
_WATCHING = [False]


def _audit(event: str, args: tuple[object, ...]) -> None:
    if event == "os.listdir" and _WATCHING[0]:
        _LISTED.append(os.fsdecode(args[0]))  # type: ignore[arg-type]


sys.addaudithook(_audit)


def test_an_exited_command_is_finished_without_reading_every_process(tmp_path: Path) -> None:
    """The common case (nothing left) costs no walk of /proc; a straggler in the group is still killed."""
    _LISTED.clear()
    _WATCHING[0] = True
    try:
        quiet = ProcessRunner().run(["sh", "-c", "echo done"], cwd=tmp_path, timeout=30)
        walked_quiet = _LISTED.count("/proc")
        ProcessRunner().run(["sh", "-c", "sleep 100 >/dev/null 2>&1 & echo done"], cwd=tmp_path, timeout=30)
        walked_straggler = _LISTED.count("/proc") - walked_quiet
    finally:
        _WATCHING[0] = False
    assert quiet.stdout == "done\n" and walked_quiet == 0
    assert processes_in(tmp_path, settle=0) == []  # the straggler was killed and waited for, not left dying
    assert walked_straggler >= 1  # ... by the walk, paid only then
