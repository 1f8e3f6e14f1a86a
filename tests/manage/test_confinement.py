"""Whatever the cache's files say, flakebot never removes, moves or writes anything outside its cache dir.

The invariant is checked over every door a cache file opens: each path field
of an intent and of an inventory record pointed at a sentinel directory outside
the cache (straight, through ``..``, through a symlink inside the cache),
each field of an intent given a wrong type, and each layout directory
replaced by a symlink to an outside directory; then the commands that act on
the cache (``recover``, ``list``, ``doctor``, ``clean``, ``clean --all``)
run, and the sentinel must be byte for byte as it was, with no traceback.
Workspaces and store entries are made by hand (no cargo), as in
``test_transaction.py``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import pytest
from test_transaction import _entry, _git, _record, _workspace, installed  # noqa: F401  (the fixture)

from flakebot_magic.cli import main
from flakebot_magic.config import Settings
from flakebot_magic.host.cache import CacheLayout
from flakebot_magic.manage.transaction import Intent, recover
from flakebot_magic.records.inventory import Inventory, ToolRecord

TXN = "feed-0001"
NEW_KEY = "e" * 32

#: each path field of an intent, and the directory of the cache it belongs under
INTENT_PATHS = {
    "final": "workspaces",
    "next": "workspaces/.next",
    "aside": "workspaces/.old",
    "recipe": "recipes",
    "record.store_path": "store",
    "record.workspace": "workspaces",
}
#: each path field of an inventory record, and where it belongs
RECORD_PATHS = {"store_path": "store", "workspace": "workspaces", "binary": "store", "log_path": "logs"}
#: what each field points at inside the sentinel (a thing a command would remove, move or write)
TARGETS = {
    "final": "demo",
    "next": "attempt/demo",
    "aside": "old",
    "recipe": "recipe.json",
    "store_path": ".",
    "workspace": "demo",
    "binary": "bin/demo",
    "log_path": "demo.log",
}
FORMS = ["outside", "dotdot", "symlink"]


def _sentinel(root: Path) -> Path:
    """An outside directory that looks like every thing a cache path may name: a workspace with a stale git lock,
    an attempt, a store entry whole enough to finish a transaction with, a recipe, a log."""
    root.mkdir()
    (root / "precious.txt").write_text("years of work")
    for workspace in (root / "demo", root / "attempt" / "demo", root / "old"):
        _workspace(workspace, "outside")
        (workspace / ".git" / "index.lock").write_text("")
    (root / "bin").mkdir()
    (root / "bin" / "demo").write_text("#!/bin/sh\necho outside\n")
    (root / "manifest.json").write_text(json.dumps({"hash": NEW_KEY, "binaries": ["demo"], "tools": {}}))
    (root / "recipe.json").write_text("{}")
    (root / "demo.log").write_text("outside log")
    return root


@pytest.fixture
def sentinel(tmp_path: Path) -> Path:
    return _sentinel(tmp_path / "sentinel")


def _snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root`` and what it is: a file's bytes, a link's target, a directory's mode."""
    seen = {}
    for path in sorted(root.rglob("*")):
        key = str(path.relative_to(root))
        if path.is_symlink():
            seen[key] = "link " + os.readlink(path)
        elif path.is_dir():
            seen[key] = f"dir {path.stat().st_mode:o}"
        else:
            seen[key] = path.read_bytes().hex()
    return seen


def _pointing(settings: Settings, field: str, place: str, sentinel: Path, form: str) -> str:
    """A path for ``field`` that leads into ``sentinel``: straight, through ``..`` from its place, or through a
    symlink made in its place."""
    target = (sentinel / TARGETS[field]).resolve()
    home = settings.cache_dir / place
    home.mkdir(parents=True, exist_ok=True)
    if form == "outside":
        return str(target)
    if form == "dotdot":
        return os.path.join(home, os.path.relpath(target, home))
    link = home / f"link-{field}"
    link.symlink_to(sentinel)
    relative = target.relative_to(sentinel.resolve())
    return str(link / relative) if str(relative) != "." else str(link)


def _intent(settings: Settings, *, make: bool = True) -> dict[str, Any]:
    """What ``install`` writes before it does anything: a new workspace beside (made with ``make``), a new store
    entry, a recipe."""
    workspaces = settings.cache.workspaces
    new = workspaces / ".next" / "demo-1-2" / "demo"
    if make:
        (workspaces / ".old").mkdir()  # as aside_path makes it
        _workspace(new, "new")
        _entry(settings, NEW_KEY)
    record = _record(settings, settings.cache.store / f"{NEW_KEY}-demo-1.0.0", _git(new, "rev-parse", "HEAD"))
    record.extra = {"txn": TXN}
    intent = Intent(
        id=TXN,
        name="demo",
        record=record.to_json(),
        final=str(workspaces / "demo"),
        next=str(new),
        aside=str(workspaces / ".old" / "demo-1"),
        recipe=str(settings.cache.recipes / "demo.json"),
        recipe_data={"store": record.store_path},
        pid=2**22 + 1,
        created=1.0,
    )
    return asdict(intent)


def _write(settings: Settings, name: str, data: dict[str, Any]) -> Path:
    settings.cache.intents.mkdir(parents=True, exist_ok=True)
    path = settings.cache.intents / f"{name}.json"
    path.write_text(json.dumps(data))
    return path


def _commands(settings: Settings, capsys: pytest.CaptureFixture[str]) -> str:
    """Every command that acts on the cache, as a user runs them; what they printed (each must succeed)."""
    said = []
    for argv in (["list"], ["show", "demo"], ["logs", "demo"], ["doctor"], ["clean"], ["list"], ["clean", "--all"]):
        code = main([*argv, "--cache-dir", str(settings.cache_dir)])
        out = capsys.readouterr()
        said.append(out.out + out.err)
        assert code in (0, 1), (argv, code, out.err)
        assert "Traceback" not in said[-1], said[-1]
    return "\n".join(said)


def test_a_sound_intent_is_finished(installed: tuple[Settings, ToolRecord]) -> None:  # noqa: F811
    """The check lets through what install writes: without this the tests below could pass by refusing all."""
    settings, old = installed
    _write(settings, "demo", _intent(settings))
    [note] = recover(settings)
    assert note.startswith("finished the build of 'demo'"), note
    now = Inventory(settings.cache.tools).get("demo")
    assert now is not None and now.commit != old.commit and now.extra["txn"] == TXN
    assert json.loads((settings.cache.recipes / "demo.json").read_text())["store"] == now.store_path
    [aside] = (settings.cache.workspaces / ".old").iterdir()
    assert _git(aside, "rev-parse", "HEAD") == old.commit


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("field", list(INTENT_PATHS))
def test_an_intent_naming_a_path_outside_its_place_is_set_aside_never_acted_on(
    installed: tuple[Settings, ToolRecord],  # noqa: F811
    sentinel: Path,
    capsys: pytest.CaptureFixture[str],
    field: str,
    form: str,
) -> None:
    settings, old = installed
    data = _intent(settings)
    value = _pointing(settings, field.removeprefix("record."), INTENT_PATHS[field], sentinel, form)
    if field.startswith("record."):
        data["record"][field.removeprefix("record.")] = value
        if field == "record.store_path":
            data["record"]["binary"] = str(Path(value) / "bin" / "demo")
    else:
        data[field] = value
    path = _write(settings, "demo", data)
    before = _snapshot(sentinel)
    [note] = recover(settings)
    assert note.startswith(f"set aside the damaged intent {path}") and "nothing was done" in note, note
    assert not path.exists() and len(list(settings.cache.damaged.iterdir())) == 1
    now = Inventory(settings.cache.tools).get("demo")
    assert now is not None and now.commit == old.commit and _git(Path(old.workspace), "rev-parse", "HEAD") == old.commit
    _commands(settings, capsys)
    assert _snapshot(sentinel) == before


@pytest.mark.parametrize("form", ["outside", "symlink"])
@pytest.mark.parametrize("field", list(RECORD_PATHS))
def test_a_record_naming_a_path_outside_the_cache_moves_nothing_there(
    installed: tuple[Settings, ToolRecord],  # noqa: F811
    sentinel: Path,
    capsys: pytest.CaptureFixture[str],
    field: str,
    form: str,
) -> None:
    settings, old = installed
    record = ToolRecord.from_json(
        {**old.to_json(), field: _pointing(settings, field, RECORD_PATHS[field], sentinel, form)}
    )
    Inventory(settings.cache.tools).save(record)
    before = _snapshot(sentinel)
    _commands(settings, capsys)
    assert _snapshot(sentinel) == before


def _wrong(kind: str) -> list[Any]:
    """Values of every JSON type but ``kind``'s."""
    every: dict[str, Any] = {"str": "x", "int": 7, "float": 1.5, "dict": {"a": 1}, "list": [1], "bool": True}
    every["null"] = None
    accepted = {"str": {"str"}, "int": {"int"}, "float": {"int", "float"}, "dict[str, Any]": {"dict"}}
    accepted["int | None"] = {"int", "null"}
    return [value for name, value in every.items() if name not in accepted[kind]]


@pytest.mark.parametrize(
    ("field", "value"),
    [(f.name, value) for f in fields(Intent) for value in _wrong(str(f.type))]
    + [(f"record.{f.name}", value) for f in fields(ToolRecord) for value in _wrong(str(f.type))[:2]],
)
def test_an_intent_of_a_wrong_type_is_set_aside_and_stops_no_other(
    installed: tuple[Settings, ToolRecord],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    field: str,
    value: Any,
) -> None:
    """Each field given each wrong type: one line, the file kept in damaged/, and the sound intent beside it (of
    another tool, sorted after it) still finished by the same command."""
    settings, _ = installed
    data = _intent(settings)
    if field.startswith("record."):
        data["record"][field.removeprefix("record.")] = value
    else:
        data[field] = value
    bad = _write(settings, "aaa", {**data, "name": "aaa"} if field != "name" else data)
    _write(settings, "demo", _intent(settings, make=False))
    code = main(["list", "--cache-dir", str(settings.cache_dir)])
    out = capsys.readouterr()
    assert code == 0 and "Traceback" not in out.out + out.err, out.err
    notes = [line for line in out.err.splitlines() if "set aside the damaged intent" in line]
    assert len(notes) == 1 and str(bad) in notes[0], out.err
    assert "finished the build of 'demo'" in out.err, out.err
    assert not bad.exists() and len(list(settings.cache.damaged.iterdir())) == 1
    now = Inventory(settings.cache.tools).get("demo")
    assert now is not None and now.extra["txn"] == TXN


def test_an_intent_whose_record_the_registry_refuses_is_undone_not_a_traceback(
    installed: tuple[Settings, ToolRecord],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Of the right types but a value the registry refuses (a status it does not know): undone, in one line."""
    settings, old = installed
    data = _intent(settings)
    data["record"]["status"] = "exploded"
    path = _write(settings, "demo", data)
    assert main(["list", "--cache-dir", str(settings.cache_dir)]) == 0
    err = capsys.readouterr().err
    assert "undid the build of 'demo'" in err and "status" in err and "Traceback" not in err, err
    assert not path.exists() and _git(Path(old.workspace), "rev-parse", "HEAD") == old.commit


@pytest.mark.parametrize("place", [str(p.relative_to("/c")) for p in CacheLayout(Path("/c")).directories()])
def test_a_layout_directory_that_is_a_symlink_to_elsewhere_is_set_aside_and_never_acted_through(
    installed: tuple[Settings, ToolRecord],  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    place: str,
) -> None:
    settings, _ = installed
    directory = settings.cache_dir / place
    outside = tmp_path / "outside"
    if directory.is_dir():
        directory.rename(outside)  # what was there (a registry, store entries, workspaces) now lives outside
    else:
        outside.mkdir()
    (outside / "precious.txt").write_text("years of work")
    _sentinel(outside / "entry")  # a store entry, a workspace with a stale lock, a recipe: whatever it is taken for
    directory.parent.mkdir(parents=True, exist_ok=True)
    directory.symlink_to(outside)
    before = _snapshot(outside)
    assert main(["list", "--cache-dir", str(settings.cache_dir)]) == 0
    assert f"set aside {directory} (it was not a directory)" in capsys.readouterr().err
    assert directory.is_dir() and not directory.is_symlink()
    [aside] = directory.parent.glob(f"{directory.name}.not-a-dir-*")
    assert aside.is_symlink() and aside.resolve() == outside.resolve()  # kept: the link, not what it leads to
    _commands(settings, capsys)
    assert _snapshot(outside) == before
