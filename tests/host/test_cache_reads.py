"""Every read of a cache file is bounded and never blocks: one reader (:func:`~flakebot_magic.host.storage.read_cache_file`).

Two proofs: an AST scan that no module of ``host/storage.py``, ``records/``,
``manage/`` and ``pipeline/team.py`` reads a file another way (the allowlist says why each
exception is one), and each kind of cache file replaced by a FIFO, a device,
a symlink and a 1 GiB sparse file, read by the function that reads it: a
clear error or a damage notice, within the test's timeout (a FIFO would
block forever, the sparse file would take a GiB of memory).
"""

from __future__ import annotations

import ast
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from flakebot_magic.errors import CacheFileDamaged
from flakebot_magic.host.entry import entry_damage
from flakebot_magic.host.storage import read_cache_file, read_cache_json
from flakebot_magic.records.inventory import Inventory
from flakebot_magic.records.provenance import _flake_lock_hash
from flakebot_magic.records.runlog import log_part

PACKAGE = Path(__file__).resolve().parents[2] / "flakebot_magic"
SCANNED = [PACKAGE / "host" / "storage.py", *sorted((PACKAGE / "records").glob("*.py")),
           *sorted((PACKAGE / "manage").glob("*.py")), PACKAGE / "pipeline" / "team.py"]  # fmt: skip
#: (module, line text) that may open a file another way, and why
ALLOWED = {
    # a fresh inventory is made beside its name (O_EXCL, O_NOFOLLOW), then linked: a write, not a read
    ("records/inventory.py", "os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600))"),
    # a new edit session's journal is created (O_CREAT | O_EXCL | O_NOFOLLOW, append only): a write, not a read
    ("records/journal.py", "fd = os.open("),
    # the unit store's objects (and the files it seals) are streamed in 1 MiB chunks, hashed as they are read,
    # opened without following a link or blocking, and refused unless regular and of the recorded size
    ("records/units.py", "fd = os.open(path, _READ, dir_fd=dir_fd)"),
    # ... and written as new files only (O_EXCL, O_NOFOLLOW), and directories opened to write into, never read
    ("records/units.py", "return os.open(path, _CREATE, 0o600, dir_fd=dir_fd)"),
    ("records/units.py", "return os.open(path, self._FLAGS, dir_fd=dir_fd)"),
}
READERS = {"read_text", "read_bytes", "open"}


def _reads(path: Path) -> list[tuple[str, str]]:
    source = path.read_text()
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in READERS:
                found.append((str(path.relative_to(PACKAGE)), lines[node.lineno - 1].strip()))
    return found


def test_no_cache_file_is_read_around_the_one_reader() -> None:
    found = {read for path in SCANNED for read in _reads(path)}
    assert found - ALLOWED == set(), "read cache files with host.storage.read_cache_file"
    assert found >= ALLOWED, "an allowlisted read is gone: drop it from ALLOWED"


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _device(path: Path) -> None:
    try:
        os.mknod(path, 0o600 | 0o020000, os.makedev(1, 5))  # a character device: /dev/zero's numbers
    except PermissionError:
        path.symlink_to("/dev/zero")


def _symlink(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _sparse(path: Path) -> None:
    with open(path, "wb") as handle:
        handle.truncate(1 << 30)


SPECIALS = {"fifo": _fifo, "device": _device, "symlink": _symlink, "sparse-1GiB": _sparse}


def _manifest(root: Path, make: Callable[[Path], None]) -> str:
    entry = root / "entry"
    (entry / "bin").mkdir(parents=True)
    make(entry / "manifest.json")
    return entry_damage(entry)


def _log(root: Path, make: Callable[[Path], None]) -> str:
    make(root / "t.log")
    return log_part("last build", root / "t.log", 10)


def _record(root: Path, make: Callable[[Path], None]) -> str:
    (root / "tools").mkdir()
    make(root / "tools" / "t.json")  # a legacy one-file-per-tool record, imported once
    Inventory(root / "tools").all()
    return "skipped" if (root / "tools" / "t.json").exists() else "imported"


def _flake_lock(root: Path, make: Callable[[Path], None]) -> str:
    make(root / "flake.lock")
    return _flake_lock_hash(root) or "no hash"


KINDS = {
    "manifest": (_manifest, "is damaged or unreadable"),
    "log": (_log, "is damaged"),
    "record": (_record, "skipped"),
    "flake.lock": (_flake_lock, "no hash"),
}


@pytest.mark.timeout(20)
@pytest.mark.parametrize("special", SPECIALS)
@pytest.mark.parametrize("kind", KINDS)
def test_a_special_cache_file_is_a_notice_never_a_hang(tmp_path: Path, kind: str, special: str) -> None:
    read, expected = KINDS[kind]
    assert expected in read(tmp_path, SPECIALS[special])


@pytest.mark.timeout(20)
@pytest.mark.parametrize("special", SPECIALS)
def test_the_reader_names_the_file_and_doctor(tmp_path: Path, special: str) -> None:
    SPECIALS[special](tmp_path / "m.json")
    with pytest.raises(CacheFileDamaged, match=r"m\.json is damaged .*flakebot doctor"):
        read_cache_json(tmp_path / "m.json")


def test_a_regular_file_reads_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "m.json").write_text(json.dumps({"a": 1}))
    assert read_cache_json(tmp_path / "m.json") == {"a": 1}
    assert read_cache_file(tmp_path / "m.json", limit=8) == b'{"a": 1}'  # exactly the limit is fine
    with pytest.raises(CacheFileDamaged, match="more than 3 bytes"):
        read_cache_file(tmp_path / "m.json", limit=3)
    with pytest.raises(FileNotFoundError):
        read_cache_file(tmp_path / "missing.json")
