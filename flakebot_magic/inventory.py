"""The tools this machine has built: a SQLite registry in the cache dir, shared by kernels and the Jupyter server.

Several kernels, the ``flakebot`` command and the Jupyter server extension
read and write the same file at once. SQLite in WAL mode lets readers go on
while one writer writes; every write is one short ``BEGIN IMMEDIATE``
transaction, so two processes never interleave a read-modify-write. Each call
opens its own connection: nothing is shared between threads or processes.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

__all__ = ["DB_NAME", "STATUSES", "Inventory", "ToolRecord"]

#: the registry's file name inside ``<cache>/tools``
DB_NAME = "tools.sqlite3"

#: what a tool can be doing: ``ready`` (a command-line tool, run per call),
#: ``running`` / ``stopped`` / ``failed`` (a tool with its own process: http, mcp)
STATUSES = ("ready", "running", "stopped", "failed")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tools (
    name    TEXT PRIMARY KEY,
    kind    TEXT NOT NULL,
    status  TEXT NOT NULL,
    updated REAL NOT NULL,
    record  TEXT NOT NULL          -- the whole ToolRecord as JSON
)
"""

#: seconds a writer waits for another process's transaction before giving up
BUSY_TIMEOUT = 30.0


@dataclass
class ToolRecord:
    """What is known about a deployed tool: enough to call it again, to prove its origin, and its state."""

    name: str
    crate: str
    version: str
    binary: str
    store_path: str
    source_hash: str
    checksum: str
    checksum_kind: str
    registry: str
    workspace: str
    commit: str
    backend: str = "cargo"
    kind: str = "cli"
    description: str = ""
    created: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    #: one of :data:`STATUSES`
    status: str = "ready"
    #: when the tool's process started (http, mcp tools), else when it was built
    started: float = 0.0
    #: the tool's own process, for tools that keep one running
    pid: int | None = None
    #: where an http tool listens (a loopback URL)
    url: str = ""
    #: the build's log (cargo, nix output), kept after the run
    log_path: str = ""
    #: the words the tool was built from
    request: str = ""
    #: the model that wrote the tool ("" for a crate deployed as published), and its check runs
    model: str = ""
    iterations: int = 0
    #: who asked for the build when it was not a person at a front door: an MCP client's name, or "notebook"
    #: (``flakebot_magic.call``); "" for the magic, the command and ``build()``
    requested_by: str = ""
    updated: float = 0.0
    #: an http tool's per-start bearer token: the Jupyter proxy sends it; never shown
    token: str = field(default="", repr=False)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def public_json(self) -> dict[str, Any]:
        """The record without its secret; :func:`flakebot_magic.tools.tool_json` (the tool's JSON) builds on it."""
        data = self.to_json()
        del data["token"]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ToolRecord:
        """A record from JSON; keys this version does not know land in ``extra``."""
        known = {f.name for f in fields(cls)}
        record = cls(**{k: v for k, v in data.items() if k in known})
        unknown = {k: v for k, v in data.items() if k not in known}
        if unknown:
            record.extra = {**unknown, **record.extra}
        return record


class Inventory:
    """The tool registry: ``<cache>/tools/tools.sqlite3``.

    Parameters
    ----------
    tools_dir
        ``Settings.tools_dir``. Records written by older versions (one JSON
        file per tool in this directory) are moved into the database on first use.

    Examples
    --------
    >>> inventory = Inventory(settings.tools_dir)            # doctest: +SKIP
    >>> inventory.update("md", status="stopped")             # doctest: +SKIP
    """

    def __init__(self, tools_dir: Path) -> None:
        self.dir = tools_dir
        self.path = tools_dir / DB_NAME

    # -- connections ----------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        self.dir.mkdir(parents=True, exist_ok=True)
        fresh = not self.path.exists()
        if fresh:
            # it holds http tools' tokens: this user's only (SQLite gives -wal and -shm the same mode)
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT, isolation_level=None)
        try:
            db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT * 1000)}")
            if fresh or db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")
            db.execute(_SCHEMA)
            if fresh:
                self._import_json(db)
        except BaseException:
            db.close()
            raise
        return db

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; BEGIN IMMEDIATE takes the write lock before the first read."""
        with closing(self._connect()) as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def _import_json(self, db: sqlite3.Connection) -> None:
        # the registry used to be one JSON file per tool; move those records in
        for path in sorted(self.dir.glob("*.json")):
            try:
                record = ToolRecord.from_json(json.loads(path.read_text()))
            except (OSError, ValueError, TypeError):
                continue
            db.execute(
                "INSERT OR IGNORE INTO tools (name, kind, status, updated, record) VALUES (?, ?, ?, ?, ?)",
                (record.name, record.kind, record.status, time.time(), json.dumps(record.to_json())),
            )
            path.unlink(missing_ok=True)

    @staticmethod
    def _put(db: sqlite3.Connection, record: ToolRecord) -> None:
        record.updated = time.time()
        db.execute(
            "INSERT OR REPLACE INTO tools (name, kind, status, updated, record) VALUES (?, ?, ?, ?, ?)",
            (record.name, record.kind, record.status, record.updated, json.dumps(record.to_json(), sort_keys=True)),
        )

    @staticmethod
    def _read(db: sqlite3.Connection, name: str) -> ToolRecord | None:
        row = db.execute("SELECT record FROM tools WHERE name = ?", (name,)).fetchone()
        return ToolRecord.from_json(json.loads(row[0])) if row else None

    # -- the API --------------------------------------------------------------

    def save(self, record: ToolRecord) -> None:
        """Insert or replace the record named ``record.name``."""
        if record.status not in STATUSES:
            raise ValueError(f"status {record.status!r} is not one of {STATUSES}")
        with self._write() as db:
            self._put(db, record)

    def _exists(self) -> bool:
        return self.path.exists() or (self.dir.is_dir() and any(self.dir.glob("*.json")))

    def get(self, name: str) -> ToolRecord | None:
        if not self._exists():
            return None
        with closing(self._connect()) as db:
            return self._read(db, name)

    def all(self) -> list[ToolRecord]:
        """Every record, by name."""
        if not self._exists():
            return []
        with closing(self._connect()) as db:
            rows = db.execute("SELECT record FROM tools ORDER BY name").fetchall()
        return [ToolRecord.from_json(json.loads(row[0])) for row in rows]

    def remove(self, name: str) -> None:
        if not self._exists():
            return
        with self._write() as db:
            db.execute("DELETE FROM tools WHERE name = ?", (name,))

    def modify(self, name: str, change: Callable[[ToolRecord], None]) -> ToolRecord | None:
        """Read, change and write one record in one transaction; None when there is no such tool.

        No other process can write between the read and the write, so
        concurrent changes never overwrite each other.
        """
        with self._write() as db:
            record = self._read(db, name)
            if record is None:
                return None
            change(record)
            if record.status not in STATUSES:
                raise ValueError(f"status {record.status!r} is not one of {STATUSES}")
            self._put(db, record)
            return record

    def update(self, name: str, **changes: Any) -> ToolRecord | None:
        """Set fields of one record atomically: ``update("md", status="stopped", pid=None)``."""
        known = {f.name for f in fields(ToolRecord)}
        unknown = set(changes) - known
        if unknown:
            raise TypeError(f"ToolRecord has no field(s) {sorted(unknown)}")

        def change(record: ToolRecord) -> None:
            for key, value in changes.items():
                setattr(record, key, value)

        return self.modify(name, change)
