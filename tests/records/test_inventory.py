"""The SQLite tool inventory: its API, old JSON records, and several processes writing at once."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
import threading
from contextlib import closing
from pathlib import Path

import pytest
from damage import damage

from flakebot_magic.errors import InventoryDamaged
from flakebot_magic.records.inventory import DB_NAME, Inventory, ToolRecord


def record(name: str, **changes: object) -> ToolRecord:
    base = ToolRecord(
        name=name,
        crate="tinyecho",
        version="0.2.0",
        binary="/store/x/bin/tinyecho",
        store_path="/store/x",
        source_hash="abc123",
        checksum="c0ffee",
        checksum_kind="sha256",
        registry="dir:/r",
        workspace="/ws/" + name,
        commit="deadbeef",
        created=1.0,
    )
    for key, value in changes.items():
        setattr(base, key, value)
    return base


def test_save_get_all_remove(tmp_path: Path) -> None:
    inventory = Inventory(tmp_path / "tools")
    assert inventory.all() == [] and inventory.get("md") is None
    inventory.save(record("md"))
    inventory.save(record("hx", kind="http", status="running", pid=1234, url="http://127.0.0.1:9/"))
    assert [r.name for r in inventory.all()] == ["hx", "md"]
    got = inventory.get("hx")
    assert got is not None and got.pid == 1234 and got.status == "running" and got.updated > 0
    inventory.save(record("md", version="0.3.0"))
    assert inventory.get("md").version == "0.3.0"  # type: ignore[union-attr]
    inventory.remove("md")
    assert [r.name for r in inventory.all()] == ["hx"]


def test_update_is_atomic_and_checked(tmp_path: Path) -> None:
    inventory = Inventory(tmp_path / "tools")
    inventory.save(record("hx", kind="http", status="running", pid=42))
    assert inventory.update("hx", status="stopped", pid=None).status == "stopped"  # type: ignore[union-attr]
    assert inventory.get("hx").pid is None  # type: ignore[union-attr]
    assert inventory.update("nope", status="stopped") is None
    with pytest.raises(ValueError, match="status"):
        inventory.update("hx", status="exploded")
    with pytest.raises(TypeError, match="colour"):
        inventory.update("hx", colour="red")
    assert inventory.get("hx").status == "stopped"  # type: ignore[union-attr]  # the bad update rolled back


def test_uses_wal_and_is_private(tmp_path: Path) -> None:
    inventory = Inventory(tmp_path / "tools")
    inventory.save(record("md", token="secret"))
    path = tmp_path / "tools" / DB_NAME
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert path.stat().st_mode & 0o077 == 0  # it holds http tools' tokens
    got = inventory.get("md")
    assert got is not None and got.token == "secret" and "token" not in got.public_json()
    assert "secret" not in repr(got)


def test_old_json_records_move_into_the_database(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    old = record("md").to_json()
    for key in ("status", "started", "pid", "url", "log_path", "request", "updated"):
        del old[key]  # the JSON registry had none of these
    old["from_the_future"] = 7
    (tools / "md.json").write_text(json.dumps(old))
    got = Inventory(tools).get("md")
    assert got is not None and got.status == "ready" and got.extra["from_the_future"] == 7
    assert not (tools / "md.json").exists()


_WORKER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from flakebot_magic.records.inventory import Inventory, ToolRecord

    tools, me, rounds = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    inventory = Inventory(tools)

    def bump(record):
        record.extra["hits"] = record.extra.get("hits", 0) + 1
        record.extra.setdefault("by", []).append(me)

    for i in range(rounds):
        inventory.save(ToolRecord(
            name=f"{me}_{i}", crate="c", version="1", binary="b", store_path="s", source_hash="h",
            checksum="", checksum_kind="", registry="r", workspace="w", commit="",
        ))
        inventory.modify("shared", bump)
        inventory.all()
    """
)


def test_several_processes_write_at_once(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    Inventory(tools).save(record("shared"))
    workers, rounds = 6, 40
    procs = [
        subprocess.Popen([sys.executable, "-c", _WORKER, str(tools), f"w{n}", str(rounds)], stderr=subprocess.PIPE)
        for n in range(workers)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
    inventory = Inventory(tools)
    records = inventory.all()
    assert len(records) == workers * rounds + 1
    shared = inventory.get("shared")
    assert shared is not None
    # every read-modify-write landed: no process overwrote another's change
    assert shared.extra["hits"] == workers * rounds
    assert sorted(set(shared.extra["by"])) == [f"w{n}" for n in range(workers)]
    with closing(sqlite3.connect(tools / DB_NAME)) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


# -- reading never writes; the health check ---------------------------------------------------------


def test_reading_a_missing_registry_makes_nothing(tmp_path: Path) -> None:
    inventory = Inventory(tmp_path / "tools")
    assert inventory.all() == [] and inventory.get("md") is None
    assert not (tmp_path / "tools").exists()


def test_reading_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    inventory = Inventory(tmp_path / "tools")
    inventory.save(record("md"))
    path = tmp_path / "tools" / DB_NAME
    with closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    assert [r.name for r in inventory.all()] == ["md"] and inventory.check(["x"]).ok
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before


def _damaged(tmp_path: Path, how: str) -> Inventory:
    inventory = Inventory(tmp_path / "tools")
    for name in ("a", "b", "c"):
        inventory.save(record(name, description="x" * 3000))  # a few pages
    path = tmp_path / "tools" / DB_NAME
    if how == "bad-record":
        with closing(sqlite3.connect(path)) as db:
            db.execute("UPDATE tools SET record = '[1, 2' WHERE name = 'b'")
            db.commit()
    else:
        damage(path, how, table="tools")
    return inventory


@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("zero-length", "empty"),
        ("missing", "missing"),
        ("random-bytes", "unreadable"),
        ("truncated", "unreadable"),
        ("bad-page", "unreadable"),
        ("bad-record", "record"),
    ],
)
def test_the_health_check_finds_each_kind_of_damage(tmp_path: Path, how: str, reason: str) -> None:
    inventory = _damaged(tmp_path, how)
    health = inventory.check(["entry"])
    assert (health.ok, health.reason) == (False, reason), health
    if reason in ("unreadable", "record"):  # every read says what to do, never a raw SQLite error
        with pytest.raises(InventoryDamaged, match="flakebot doctor"):
            inventory.all()
    else:  # an empty or missing registry reads as empty; only the store says it should not be
        assert inventory.all() == [] and inventory.check([]).ok


def test_an_emptied_registry_is_healthy_once_reconciled_with_the_store(tmp_path: Path) -> None:
    inventory = _damaged(tmp_path, "random-bytes")
    aside = inventory.replace_all([], ["entry"])
    assert aside is not None and aside.name.startswith(f"{DB_NAME}.damaged-") and aside.is_file()
    assert inventory.check(["entry"]).ok  # the doctor saw that entry and found no tool using it
    assert inventory.check(["entry", "another"]).reason == "empty"  # an entry it never saw
    inventory.replace_all([record("a")], ["entry", "another"])
    assert [r.name for r in inventory.all()] == ["a"] and inventory.check(["entry", "another"]).ok


def _record_constructions() -> list[str]:
    """Every place in the package that calls ``ToolRecord(...)`` itself, as ``module:function``."""
    import ast

    import flakebot_magic

    package = Path(flakebot_magic.__file__).parent
    sites = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if not isinstance(node, ast.Call):
                    continue
                callee = node.func
                named = callee.id if isinstance(callee, ast.Name) else getattr(callee, "attr", None)
                # `cls(...)` inside ToolRecord's own classmethods counts too
                if named == "ToolRecord" or (named == "cls" and path.name == "inventory.py"):
                    sites.append(f"{path.relative_to(package).with_suffix('')}:{function.name}")
    return sites


def test_only_the_factories_build_a_record() -> None:
    """A record is made in one place (its 25 fields agree everywhere): ToolRecord.of_entry for a deployed tool,
    ToolRecord.stand_in for one never saved. A second hand-built ``ToolRecord(...)`` in the package fails here."""
    sites = _record_constructions()
    # from_json reads a saved record back: it makes none
    expected = ["records/inventory:from_json", "records/inventory:of_entry", "records/inventory:stand_in"]
    assert sorted(set(sites)) == expected, sites


def test_of_entry_takes_the_manifest_and_overrides(tmp_path: Path) -> None:
    manifest = {
        "crate": "tinyecho",
        "version": "0.2.0",
        "hash": "h1",
        "checksum": "c1",
        "checksum_kind": "sha256",
        "registry": "dir:/r",
        "description": "echoes",
        "backend": "nix",
        "lock_hash": "L",
        "gcroot": "/g",
        "model": "m",
        "iterations": "3",
    }
    entry = tmp_path / "store" / "e"
    made = ToolRecord.of_entry(
        "echo",
        entry,
        manifest,
        binary="/b",
        workspace="/w",
        commit="abc",
        kind="cli",
        created=5.0,
        extra={"choice": {"by": "user"}},
        version="0.3.0",
        request="echo it",
    )
    assert (made.crate, made.version, made.source_hash, made.checksum, made.registry) == (
        "tinyecho",
        "0.3.0",
        "h1",
        "c1",
        "dir:/r",
    )
    assert (made.backend, made.model, made.iterations, made.request, made.store_path) == (
        "nix",
        "m",
        3,
        "echo it",
        str(entry),
    )
    assert made.extra == {"choice": {"by": "user"}, "entry": str(entry), "lock_hash": "L", "gcroot": "/g"}
    cargo = ToolRecord.of_entry(
        "echo", entry, {**manifest, "backend": ""}, binary="/b", workspace="", commit="", kind="cli", created=0.0
    )
    assert (cargo.backend, cargo.extra) == ("cargo", {})


def test_stand_in_leaves_what_it_is_not_told_empty() -> None:
    made = ToolRecord.stand_in("x", crate="c", created=2.0)
    assert (made.name, made.crate, made.created, made.binary, made.commit, made.status) == (
        "x",
        "c",
        2.0,
        "",
        "",
        "ready",
    )


def _at_once(tools: Path, errors: list[BaseException], start: threading.Barrier, write: bool) -> None:
    try:
        start.wait()
        if write:
            Inventory(tools)._connect().close()
        else:
            for _ in range(20):
                Inventory(tools).all()
    except BaseException as exc:  # any error at all is the failure
        errors.append(exc)


def test_a_fresh_inventory_made_by_many_at_once_is_whole_to_every_reader(tmp_path: Path) -> None:
    """Two builds' threads in a fresh cache: one makes the database while the other reads it (a half-made one was
    'damaged'). It is made beside its name and linked whole; the other writers use it, readers see it whole."""
    for attempt in range(25):
        tools = tmp_path / f"cache{attempt}" / "tools"
        errors: list[BaseException] = []
        start = threading.Barrier(8)
        threads = [threading.Thread(target=_at_once, args=(tools, errors, start, n % 2 == 1)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert errors == [], errors
        assert sorted(p.name for p in tools.iterdir() if p.name.endswith(".tmp")) == []  # no half-made one left
        assert (tools / DB_NAME).stat().st_mode & 0o777 == 0o600
