"""Damage a SQLite file the ways a crash, a failing disk or a stray write do, for the corruption tests.

``tests/`` is on ``sys.path`` (it has a conftest and no ``__init__.py``)::

    from damage import WAYS, damage
"""

from __future__ import annotations

import os
import sqlite3
from contextlib import closing
from pathlib import Path

__all__ = ["WAYS", "damage"]

#: every way :func:`damage` knows
WAYS = ("zero-length", "truncated", "random-bytes", "bad-page", "missing")


def damage(path: Path, how: str, *, table: str) -> None:
    """Damage the SQLite file ``path`` ``how`` (one of :data:`WAYS`); ``bad-page`` overwrites ``table``'s root page.

    Its ``-wal`` and ``-shm`` go too: what a crash or a copy leaves is the main file alone.
    """
    with closing(sqlite3.connect(path)) as db:  # what the WAL holds goes into the file first
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
        page = db.execute("PRAGMA page_size").fetchone()[0]
    size = path.stat().st_size
    if how == "zero-length":
        path.write_bytes(b"")
    elif how == "truncated":
        with path.open("r+b") as handle:
            handle.truncate(size // 2)
    elif how == "random-bytes":
        path.write_bytes(os.urandom(size))
    elif how == "bad-page":
        with path.open("r+b") as handle:
            handle.seek((root - 1) * page)
            handle.write(os.urandom(page))
    else:
        assert how == "missing", how
        path.unlink()
    for extra in ("-wal", "-shm"):
        path.with_name(path.name + extra).unlink(missing_ok=True)
