"""The tools this machine has built: a SQLite registry in the cache dir, shared by kernels and the Jupyter server.

Several kernels, the ``flakebot`` command and the Jupyter server extension
read and write the same file at once. SQLite in WAL mode lets readers go on
while one writer writes; every write is one short ``BEGIN IMMEDIATE``
transaction, so two processes never interleave a read-modify-write. Each call
opens its own connection: nothing is shared between threads or processes.

Reading never writes: a read opens the file read-only, and finds no file (or
an empty one) as no tools, without making one. On a full disk, or in a
read-only ``tools/``, where SQLite cannot make the ``-shm`` file a WAL reader
needs, a read falls back to the database file alone (``immutable=1``), so
``list``, ``show``, ``clean`` and calls of ready tools still work. Every SQLite and OS error leaves here as a
:class:`~flakebot_magic.errors.StorageError` (:mod:`flakebot_magic.host.storage`);
a damaged file, or a record that does not parse, as
:class:`~flakebot_magic.errors.InventoryDamaged`, which ``flakebot doctor``
(:mod:`flakebot_magic.manage.doctor`) repairs. :meth:`Inventory.check` is the
health check the doctor runs at every command's start.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import closing, contextmanager
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..commands import typed
from ..errors import InventoryDamaged, StorageError
from ..host.fsutil import fsync_dir, load_json
from ..host.storage import is_full, read_cache_json, sqlite_code, storage_errors
from ..host.trees import remove_tree

__all__ = ["DB_NAME", "STATUSES", "Health", "Inventory", "ToolRecord"]

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
);
CREATE TABLE IF NOT EXISTS meta (
    key     TEXT PRIMARY KEY,
    value   TEXT NOT NULL          -- JSON
)
"""
#: what to do about a damaged registry
DOCTOR_HINT = (
    f"Run {typed('doctor')}: it keeps the damaged file aside and rebuilds the registry "
    "from the store, the recipes and the workspaces."
)
#: SQLite's I/O error and "cannot open": the -shm file a WAL reader needs could not be made (a full disk, a
#: read-only directory)
_NO_SHM = (10, 14)

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
    #: the tool's own workspace, and the commit in it its store entry was built from
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
    #: the tool that forked the source (itself, or the tool whose cached build this one reuses)
    forked_by: str = ""
    #: an http tool's per-start bearer token: the Jupyter proxy sends it; never shown
    token: str = field(default="", repr=False)
    #: the MCP revision an mcp tool's server spoke at its last start ("2026-07-28", "2025-06-18"; "" before one)
    protocol: str = ""

    @classmethod
    def of_entry(
        cls,
        name: str,
        entry: Path,
        manifest: Mapping[str, Any],
        *,
        binary: str,
        workspace: str,
        commit: str,
        kind: str,
        created: float,
        extra: Mapping[str, Any] | None = None,
        **known: Any,
    ) -> ToolRecord:
        """The record of the tool ``name`` deployed from the store entry ``entry``: the one way one is made.

        What the entry's ``manifest`` knows (crate, version, hash, checksum,
        registry, backend, model...) comes from it; ``known`` overrides any of
        those with what the caller knows better (the candidate the run forked)
        or adds what no manifest holds (the request, who asked). A nix tool's
        ``extra`` names its entry, flake lock and GC root, which ``clean``
        and ``doctor`` look for.
        """
        backend = str(known.get("backend") or manifest.get("backend") or "cargo")
        nix = (
            {"entry": str(entry), "lock_hash": manifest.get("lock_hash", ""), "gcroot": manifest.get("gcroot", "")}
            if backend == "nix"
            else {}
        )
        values: dict[str, Any] = {
            "crate": str(manifest.get("crate", "")),
            "version": str(manifest.get("version", "")),
            "source_hash": str(manifest.get("hash", "")),
            "checksum": str(manifest.get("checksum", "")),
            "checksum_kind": str(manifest.get("checksum_kind", "")),
            "registry": str(manifest.get("registry", "")),
            "description": str(manifest.get("description", "")),
            "model": str(manifest.get("model") or ""),
            "iterations": int(manifest.get("iterations") or 0),
            **known,
        }
        return cls(
            name=name,
            binary=binary,
            store_path=str(entry),
            workspace=workspace,
            commit=commit,
            kind=kind,
            created=created,
            backend=backend,
            extra={**(extra or {}), **nix},
            **{k: v for k, v in values.items() if k != "backend"},
        )

    @classmethod
    def stand_in(cls, name: str, **known: Any) -> ToolRecord:
        """A record that is never saved (a failed attempt, a loaded tool the registry has not), for listings and
        JSON: every field ``known`` does not give is empty."""
        empty = {f.name: "" for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
        return cls(**{**empty, "name": name, **known})

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def public_json(self) -> dict[str, Any]:
        """The record without its secret; :func:`flakebot_magic.manage.tools.tool_json` (the tool's JSON) builds on it."""
        data = self.to_json()
        del data["token"]
        return data

    def rebased(self, root: Path) -> ToolRecord:
        """This record with its paths in the cache dir ``root``: a cache dir moved (or copied) elsewhere keeps
        its tools, whose records were written with the old place's absolute paths.

        The old place is where its store entry was (``<old>/store/<entry>``);
        every path under it (binary, store entry, workspace, log, and the
        like in ``extra``) is moved under ``root``. Paths elsewhere (a
        ``/nix/store`` binary) stay. The one place records are resolved
        against the cache dir: :class:`Inventory` reads every record through it.
        """
        store = Path(self.store_path)
        old = store.parent.parent
        if not store.is_absolute() or store.parent.name != "store" or old == root:
            return self

        def moved(text: str) -> str:
            try:
                return str(root / Path(text).relative_to(old)) if text and Path(text).is_absolute() else text
            except ValueError:
                return text

        return replace(
            self,
            binary=moved(self.binary),
            store_path=moved(self.store_path),
            workspace=moved(self.workspace),
            log_path=moved(self.log_path),
            extra={k: moved(v) if isinstance(v, str) else v for k, v in self.extra.items()},
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ToolRecord:
        """A record from JSON; keys this version does not know land in ``extra``."""
        known = {f.name for f in fields(cls)}
        record = cls(**{k: v for k, v in data.items() if k in known})
        unknown = {k: v for k, v in data.items() if k not in known}
        if unknown:
            record.extra = {**unknown, **record.extra}
        return record


@dataclass(frozen=True)
class Health:
    """What :meth:`Inventory.check` found: ``reason`` is "" when the registry can be trusted.

    ``reason`` is ``missing`` or ``empty`` (no tools while the store holds
    entries it was never reconciled with), ``unreadable`` (SQLite cannot read
    it), ``quick_check`` (``PRAGMA quick_check`` found damage) or ``record``
    (a record that does not parse); ``problem`` says it in words.
    """

    reason: str = ""
    problem: str = ""

    @property
    def ok(self) -> bool:
        return not self.reason


class Inventory:
    """The tool inventory: ``<cache>/tools/tools.sqlite3``.

    Parameters
    ----------
    tools_dir
        ``Settings.cache.tools``. Records written by older versions (one JSON
        file per tool in this directory) are moved into the database on first use.

    Examples
    --------
    >>> inventory = Inventory(settings.cache.tools)            # doctest: +SKIP
    >>> inventory.update("md", status="stopped")             # doctest: +SKIP
    """

    def __init__(self, tools_dir: Path) -> None:
        self.dir = tools_dir
        self.path = tools_dir / DB_NAME

    # -- connections ----------------------------------------------------------

    def _damaged(self, exc: sqlite3.Error, code: str) -> StorageError:
        return InventoryDamaged(
            f"The tool inventory {self.path} is damaged ({exc}). {DOCTOR_HINT}",
            reason="unreadable",
            path=self.path,
            code=code,
        )

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        with storage_errors(what, self.path, damaged=self._damaged):
            yield

    def _connect(self) -> sqlite3.Connection:
        self.dir.mkdir(parents=True, exist_ok=True)
        created = not self.path.exists() and self._create()
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT, isolation_level=None)
        try:
            db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT * 1000)}")
            if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")
            db.executescript(_SCHEMA)
            if created:
                self._import_json(db)
        except BaseException:
            db.close()
            raise
        return db

    def _create(self) -> bool:
        """A fresh database put in place whole: made beside its name (WAL mode, the schema), then linked to it, so
        a reader or a second writer (another build's thread or process) never meets a half-made one. True when
        this call's is the one in place (it then moves old records in); False when another was first."""
        tmp = self.dir / f".{DB_NAME}.{os.getpid()}.{threading.get_ident()}.{time.monotonic_ns()}.tmp"
        # it holds http tools' tokens: this user's only (SQLite gives -wal and -shm the same mode)
        os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600))
        try:
            with closing(sqlite3.connect(tmp, isolation_level=None)) as db:
                db.execute("PRAGMA journal_mode = WAL")
                db.executescript(_SCHEMA)
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                return False
            fsync_dir(self.dir)
            return True
        finally:
            for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
                leftover.unlink(missing_ok=True)

    def _open_read_only(self, *, immutable: bool = False) -> sqlite3.Connection:
        """A connection that never writes; ``immutable``: the database file alone (no -wal, no -shm, no locks)."""
        uri = f"file:{quote(str(self.path))}?mode=ro" + ("&immutable=1" if immutable else "")
        db = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT, isolation_level=None)
        db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT * 1000)}")
        return db

    def _select(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """The rows of one read; no file (or an empty one) has none. Never writes, full disk or not."""
        if not self.path.exists() and self._legacy():
            with closing(self._connect()) as db:  # the old JSON records move in: the one read that writes
                return db.execute(sql, params).fetchall()
        try:
            if self.path.stat().st_size == 0:
                return []
        except FileNotFoundError:
            return []
        try:
            with closing(self._open_read_only()) as db:
                return db.execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            # a WAL reader needs the -shm file; on a full disk, or in a directory it may not write, SQLite
            # cannot make it
            if sqlite_code(exc)[0] not in _NO_SHM or not self._unwritable():
                raise
        with closing(self._open_read_only(immutable=True)) as db:
            return db.execute(sql, params).fetchall()

    def _unwritable(self) -> bool:
        """Whether nothing can be written beside the inventory now: a full disk, a read-only directory (or mount)."""
        return is_full(self.dir) or not os.access(self.dir, os.W_OK)

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; BEGIN IMMEDIATE takes the write lock before the first read."""
        with self._errors("saving to the tool inventory"), closing(self._connect()) as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def _legacy(self) -> bool:
        return self.dir.is_dir() and any(self.dir.glob("*.json"))

    def _import_json(self, db: sqlite3.Connection) -> None:
        # the registry used to be one JSON file per tool; move those records in
        for path in sorted(self.dir.glob("*.json")):
            try:
                record = ToolRecord.from_json(read_cache_json(path))
            except (OSError, StorageError, ValueError, TypeError):
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
    def _decode(text: Any) -> ToolRecord:
        data = load_json(text)
        if not isinstance(data, dict):
            raise TypeError(f"a {type(data).__name__}, not an object")
        return ToolRecord.from_json(data)

    def _parse(self, name: str, text: Any) -> ToolRecord:
        try:
            return self._decode(text).rebased(self.dir.parent)
        except (ValueError, TypeError) as exc:
            raise InventoryDamaged(
                f"The record of {name!r} in the tool inventory {self.path} does not parse ({exc}). {DOCTOR_HINT}",
                reason="record",
                path=self.path,
            ) from exc

    def _read(self, db: sqlite3.Connection, name: str) -> ToolRecord | None:
        row = db.execute("SELECT record FROM tools WHERE name = ?", (name,)).fetchone()
        return self._parse(name, row[0]) if row else None

    # -- the API --------------------------------------------------------------

    def save(self, record: ToolRecord) -> None:
        """Insert or replace the record named ``record.name``."""
        if record.status not in STATUSES:
            raise ValueError(f"status {record.status!r} is not one of {STATUSES}")
        with self._write() as db:
            self._put(db, record)

    def get(self, name: str) -> ToolRecord | None:
        with self._errors("reading the tool inventory"):
            rows = self._select("SELECT record FROM tools WHERE name = ?", (name,))
        return self._parse(name, rows[0][0]) if rows else None

    def all(self) -> list[ToolRecord]:
        """Every record, by name."""
        with self._errors("reading the tool inventory"):
            rows = self._select("SELECT name, record FROM tools ORDER BY name")
        return [self._parse(name, text) for name, text in rows]

    def remove(self, name: str) -> None:
        if not self.path.exists() and not self._legacy():
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

    # -- health and repair (the doctor's) ---------------------------------------------

    def check(self, store_entries: Collection[str]) -> Health:
        """Whether the registry can be trusted, given the names of the store's complete entries.

        Read-only (on a full disk too). Unhealthy: SQLite cannot read it,
        ``PRAGMA quick_check`` finds damage, a record does not parse, or it
        has no tools (or no file) while the store holds entries that
        :meth:`rebuild` never saw.
        """
        try:
            with self._errors("checking the tool inventory"):
                if not self.path.exists() and not self._legacy():
                    return self._empty("missing", store_entries, f"{self.path} does not exist")
                if self.path.exists() and self.path.stat().st_size == 0:
                    return self._empty("empty", store_entries, f"{self.path} is empty (0 bytes)")
                found = [tuple(row) for row in self._select("PRAGMA quick_check")]
                if found != [("ok",)]:
                    damage = "; ".join(str(row[0]) for row in found[:3])
                    return Health("quick_check", f"PRAGMA quick_check found damage in {self.path}: {damage}")
                rows = self._select("SELECT name, record FROM tools ORDER BY name") if self._has("tools") else []
                for name, text in rows:
                    try:
                        self._decode(text)
                    except (ValueError, TypeError) as exc:
                        return Health("record", f"the record of {name!r} in {self.path} does not parse ({exc})")
                if rows:
                    return Health()
                seen = self._meta("reconciled") if self._has("meta") else None
                unseen = set(store_entries) - set(seen if isinstance(seen, list) else [])
                return self._empty("empty", unseen, f"{self.path} holds no tools")
        except StorageError as exc:
            if not isinstance(exc, InventoryDamaged) and self._unwritable():
                return Health()  # no closer look on a full disk (or read-only): reads fall back to the file alone
            return Health("unreadable", f"SQLite cannot read {self.path} ({exc.__cause__ or exc})")

    @staticmethod
    def _empty(reason: str, store_entries: Collection[str], what: str) -> Health:
        if not store_entries:
            return Health()
        count = len(store_entries)
        return Health(reason, f"{what} while the store holds {count} entr{'y' if count == 1 else 'ies'}")

    def _has(self, table: str) -> bool:
        return bool(self._select("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)))

    def _meta(self, key: str) -> Any:
        rows = self._select("SELECT value FROM meta WHERE key = ?", (key,))
        try:
            return load_json(rows[0][0]) if rows else None
        except ValueError:
            return None

    def readable_records(self) -> dict[str, dict[str, Any]]:
        """What can still be read of the records, each as JSON (damaged rows, or all of them, left out)."""
        try:
            with self._errors("reading the tool inventory"):
                rows = self._select("SELECT name, record FROM tools")
        except StorageError:
            return {}
        found: dict[str, dict[str, Any]] = {}
        for name, text in rows:
            try:
                data = load_json(text)
            except (ValueError, TypeError):
                continue
            if isinstance(data, dict) and data.get("name") == name:
                try:
                    found[name] = ToolRecord.from_json(data).rebased(self.dir.parent).to_json()
                except (TypeError, ValueError):
                    found[name] = data
        return found

    def reconciled_namings(self) -> list[str]:
        """The store's namings of tools the last :meth:`replace_all` considered (``[]``: none, or unreadable)."""
        try:
            with self._errors("reading the tool inventory"):
                seen = self._meta("namings") if self.path.exists() and self._has("meta") else None
        except StorageError:
            return []
        return [str(key) for key in seen] if isinstance(seen, list) else []

    def replace_all(
        self, records: Collection[ToolRecord], store_entries: Collection[str], namings: Collection[str] = ()
    ) -> Path | None:
        """Make ``records`` the registry's whole content; the file they replace is kept aside, its path returned.

        The new registry is written beside under another name, then the old
        one (with its ``-wal`` and ``-shm``) is moved to
        ``tools.sqlite3.damaged-<time>`` and the new one renamed into place:
        a reader sees the old registry or the new one, never none half-made.
        ``store_entries`` (the store's complete entries) are remembered, so
        that a registry left empty on purpose is not taken for a lost one, and
        ``namings`` (the store's namings of tools the rebuild considered,
        :mod:`flakebot_magic.manage.evidence`), so that one it could make no tool of is not asked about again.
        """
        fresh = Inventory(self.dir / f".rebuilding-{os.getpid()}-{time.time_ns()}")
        try:
            with fresh._write() as db:
                for record in records:
                    self._put(db, record)
                db.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES ('reconciled', ?)",
                    (json.dumps(sorted(store_entries)),),
                )
                db.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES ('namings', ?)", (json.dumps(sorted(namings)),)
                )
            with fresh._errors("writing the rebuilt tool inventory"), closing(fresh._connect()) as db:
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                db.execute("PRAGMA journal_mode = DELETE")  # one file to move; WAL again at its next write
            aside = None
            with self._errors("putting the rebuilt tool inventory in place"):
                if self.path.exists():
                    stamp = time.strftime("%Y%m%d-%H%M%S")
                    aside = self.path.with_name(f"{DB_NAME}.damaged-{stamp}-{time.time_ns() % 10**6:06d}")
                    for suffix in ("-wal", "-shm"):
                        extra = self.path.with_name(DB_NAME + suffix)
                        if extra.exists():
                            os.replace(extra, aside.with_name(aside.name + suffix))
                    os.replace(self.path, aside)
                os.replace(fresh.path, self.path)
                fsync_dir(self.dir)
            return aside
        finally:
            remove_tree(fresh.dir, ignore_errors=True)
