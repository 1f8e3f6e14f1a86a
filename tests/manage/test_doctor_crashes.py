"""The doctor's repairs, killed at each of their crash points: the next command finds the old state or the new, whole.

Issue 34's repairs change the disk (a damaged entry set aside, an entry's
modes given back, the inventory rebuilt and put in place, a tool card
written again or set aside, a lock, an intent or a ``.git/config`` that is
no file set aside, a killed git's locks removed). Each is followed by a
:func:`~flakebot_magic.host.crashpoints.crash_point`; here the command that
makes the repair runs in a child process with ``FLAKEBOT_CRASH_AT`` at that
point, dies there (``SIGKILL``), and the next ``doctor`` must finish the job:
no whole store entry lost, every tool of one answering, a second doctor with
nothing left to do. ``tests/host/test_crashpoints.py`` holds that every such
step has its point; ``push.*`` are killed in ``tests/backends/test_nix_cache.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tinycrates import write_registry

from flakebot_magic import load
from flakebot_magic.cli import main
from flakebot_magic.config import Settings
from flakebot_magic.host.crashpoints import ENV, POINTS
from flakebot_magic.manage.transaction import CARD_FILE
from flakebot_magic.pipeline.background import start_build
from flakebot_magic.records.inventory import DB_NAME, Inventory
from flakebot_magic.request import BuildRequest

pytestmark = pytest.mark.cargo


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("crashes")
    registry = write_registry(root / "registry", ["tinyecho"])
    built = Settings(cache_dir=root / "template", registry=str(registry), backend="cargo")
    start_build(built, BuildRequest("", name="te", crate="tinyecho")).wait()
    start_build(built, BuildRequest("", name="te2", crate="tinyecho")).wait()
    yield built.cache_dir


def _te(s: Settings) -> Any:
    record = Inventory(s.cache.tools).get("te")
    assert record is not None
    return record


def _git(s: Settings, name: str) -> Path:
    return s.cache.workspaces / name / ".git"


def _dir_at(path: Path) -> None:
    path.unlink(missing_ok=True)
    (path / "inside").mkdir(parents=True)


def _fifo_at(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def _flip(s: Settings) -> None:
    binary = Path(_te(s).binary)
    binary.chmod(0o755)
    data = bytearray(binary.read_bytes())
    data[len(data) // 2] ^= 1
    binary.write_bytes(bytes(data))


def _modes(s: Settings) -> None:
    Path(_te(s).binary).chmod(0)
    Path(_te(s).store_path).chmod(0)


def _symlink_intent(s: Settings) -> None:
    (s.cache.intents / "te.json").symlink_to(s.cache_dir / "elsewhere.json")


#: each point: what damage makes the command reach it, and the command (a ``flakebot`` one, or Python code)
CASES: dict[str, tuple[Callable[[Settings], None], list[str]]] = {
    "doctor.lock_aside": (lambda s: _dir_at(s.cache.locks / "te.lock"), ["list"]),
    "lock.aside": (
        lambda s: _dir_at(s.cache.locks / "te.lock"),
        [
            "-c",
            "import sys\nfrom pathlib import Path\nfrom flakebot_magic.host.cache import CacheLayout\nfrom flakebot_magic.host.locks import tool_lock\nwith tool_lock(CacheLayout(Path(sys.argv[1])), 'te'): pass",
        ],
    ),
    "txn.intent_aside": (lambda s: _dir_at(s.cache.intents / "te.json"), ["list"]),
    "txn.intent_unlinked": (_symlink_intent, ["list"]),
    "doctor.replaced": (lambda s: (s.cache.tools / DB_NAME).unlink(), ["list"]),
    "doctor.modes": (_modes, ["doctor"]),
    "doctor.entry_aside": (_flip, ["doctor"]),
    "doctor.card_aside": (lambda s: _dir_at(_git(s, "te") / CARD_FILE), ["doctor"]),
    "doctor.card": (lambda s: (_git(s, "te") / CARD_FILE).unlink(), ["doctor"]),
    "doctor.unlocked": (lambda s: (_git(s, "te") / "index.lock").write_text(""), ["doctor"]),
    "git.config_aside": (lambda s: _dir_at(_git(s, "te") / "config"), ["doctor"]),
    "doctor.special_removed": (lambda s: _fifo_at(_git(s, "te") / "HEAD"), ["doctor"]),
    "doctor.head": (lambda s: _fifo_at(_git(s, "te") / "HEAD"), ["doctor"]),
}


def test_every_repair_point_is_killed_here_or_named_where() -> None:
    repairs = {p for p in POINTS if p.split(".")[0] in ("doctor", "lock", "git") or p.startswith("txn.intent_")}
    assert repairs == set(CASES)


def _contents(entry: Path) -> dict[str, bytes]:
    return {str(p.relative_to(entry)): p.read_bytes() for p in sorted(entry.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("point", sorted(CASES))
def test_a_repair_killed_at_its_point_is_finished_by_the_next_doctor(
    template: Path, tmp_path: Path, point: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(template, cache, symlinks=True)
    settings = Settings(cache_dir=cache, backend="cargo")
    entry = Path(_te(settings).store_path)
    before = _contents(entry)
    damage, command = CASES[point]
    damage(settings)
    argv = (
        [*command, str(cache)]
        if command[0] == "-c"
        else ["-m", "flakebot_magic.cli", *command, "--cache-dir", str(cache)]
    )
    env = {**os.environ, ENV: point}
    done = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == -9, f"not killed at {point}: {done.returncode}\n{done.stdout}\n{done.stderr}"

    whole = point != "doctor.entry_aside"  # its entry was damaged on purpose: set aside, then built again
    capsys.readouterr()
    code = main(["doctor", "--cache-dir", str(cache)])
    out = capsys.readouterr().out
    assert "Traceback" not in out
    if whole:
        assert code == 0, out
        assert _contents(entry) == before, "a whole store entry changed"
        for name in ("te", "te2"):
            assert load(name, cache_dir=str(cache))("hi") == "HI"
    else:
        assert code == 1 and "problem: te:" in out and "`flakebot rebuild te`" in out, out
        assert main(["rebuild", "te", "-q", "--cache-dir", str(cache), "--registry", _registry(template)]) == 0
    capsys.readouterr()
    assert main(["doctor", "--cache-dir", str(cache)]) == 0
    again = capsys.readouterr().out
    assert "set aside" not in again and "gave their owner" not in again and "wrote its tool card" not in again, again


def _registry(template: Path) -> str:
    return str(template.parent / "registry")
