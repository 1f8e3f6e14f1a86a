"""A damaged tool inventory, in every way it can be damaged: no traceback, nothing lost, repaired from the disk.

One cache holds two tools built for real (``te``, and ``te2``: the same
store entry under a second name, with a workspace of its own). Each case
copies it, damages the tool inventory (``tools.sqlite3``) or the search index,
and runs the next command as a user would (``flakebot list``, or ``flakebot
clean`` first, which must not delete anything it cannot prove unused). The
records come back equal to the ones before (what identifies a build), the
damaged file is kept aside under the name the message gives, and no store
entry or workspace is gone.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from damage import WAYS, damage
from tinycrates import write_registry

from flakebot_magic import load
from flakebot_magic.cli import main
from flakebot_magic.config import Settings
from flakebot_magic.errors import CacheFileDamaged
from flakebot_magic.host.cache import NOT_A_DIRECTORY, CacheLayout
from flakebot_magic.manage.doctor import doctor, store_entries
from flakebot_magic.manage.transaction import CARD_FILE
from flakebot_magic.pipeline.background import start_build
from flakebot_magic.records.inventory import DB_NAME, Inventory, ToolRecord
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.request import BuildRequest
from flakebot_magic.stages.deploy import DAMAGED_PREFIX

pytestmark = pytest.mark.cargo

#: what says "the same build" of a record
IDENTITY = ("name", "crate", "version", "binary", "store_path", "source_hash", "workspace", "commit", "forked_by")
#: every way the inventory file gets damaged
DAMAGE = (*WAYS, "bad-record")


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("doctor")
    registry = write_registry(root / "registry", ["tinyecho"])
    settings = Settings(cache_dir=root / "cache", registry=str(registry), backend="cargo")
    start_build(settings, BuildRequest("", name="te", crate="tinyecho")).wait()
    start_build(settings, BuildRequest("", name="te2", crate="tinyecho")).wait()  # from the cache: a second name
    records = {r.name: r for r in Inventory(settings.cache.tools).all()}
    shutil.copytree(settings.cache_dir, root / "template", symlinks=True)
    yield {"root": root, "settings": settings, "records": records}


def _fresh(template: dict[str, Any]) -> Settings:
    settings: Settings = template["settings"]
    shutil.rmtree(settings.cache_dir, ignore_errors=True)
    shutil.copytree(template["root"] / "template", settings.cache_dir, symlinks=True)
    return settings


def _identity(record: ToolRecord) -> dict[str, Any]:
    return {key: getattr(record, key) for key in IDENTITY}


def _damage(path: Path, how: str) -> None:
    if how == "bad-record":
        with sqlite3.connect(path) as db:
            db.execute("UPDATE tools SET record = '{\"name\": \"te\", broken' WHERE name = 'te'")
    else:
        damage(path, how, table="tools")


def _disk(settings: Settings) -> dict[str, list[str]]:
    """What is on disk besides the inventory: it must all still be there after any repair."""
    return {
        "store": sorted(p.name for p in settings.cache.store.iterdir()),
        "workspaces": sorted(p.name for p in settings.cache.workspaces.iterdir() if not p.name.startswith(".")),
        "recipes": sorted(p.name for p in settings.cache.recipes.iterdir()),
    }


def _run(capsys: pytest.CaptureFixture[str], *argv: str, code: int = 0) -> tuple[str, str]:
    capsys.readouterr()
    assert main(list(argv)) == code
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    return captured.out, captured.err


@pytest.mark.parametrize("first", ["list", "clean"])
@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_registry_is_repaired_and_nothing_is_lost(
    template: dict[str, Any], capsys: pytest.CaptureFixture[str], how: str, first: str
) -> None:
    settings = _fresh(template)
    before = _disk(settings)
    _damage(settings.cache.tools / DB_NAME, how)
    cache = str(settings.cache_dir)

    if first == "clean":  # clean first: it must stop, say why, and delete nothing a tool uses
        out, _ = _run(capsys, "clean", "--cache-dir", cache, code=1)  # it stopped short: not a success
        assert "flakebot clean stopped: the tool inventory cannot be trusted" in out
        assert "Store entries, workspaces and recipes were left alone" in out
        assert _disk(settings) == before
        message = out
    else:
        out, message = _run(capsys, "list", "--json", "--cache-dir", cache)
        assert sorted(tool["name"] for tool in json.loads(out)) == ["te", "te2"]
    assert "it was rebuilt from the store and the workspaces: 2 tools (te, te2)" in message
    aside = sorted(settings.cache.tools.glob(f"{DB_NAME}.damaged-*"))
    if how == "missing":
        assert aside == [] and "kept at" not in message
    else:  # the damaged file is kept, and the message names it
        [kept] = [p for p in aside if not p.name.endswith(("-wal", "-shm"))]
        assert f"the damaged file is kept at {kept}" in message

    records = {r.name: r for r in Inventory(settings.cache.tools).all()}
    assert {n: _identity(r) for n, r in records.items()} == {n: _identity(r) for n, r in template["records"].items()}
    assert records["te2"].forked_by == "te" and records["te2"].workspace != records["te"].workspace
    assert Inventory(settings.cache.tools).check(store_entries(settings)).ok
    assert _disk(settings) == before
    # the tools answer, and a clean now removes nothing either (both tools use what there is)
    out, _ = _run(capsys, "show", "te2", "--cache-dir", cache)
    assert "te2" in out
    out, _ = _run(capsys, "clean", "--cache-dir", cache)
    assert "stopped" not in out and _disk(settings) == before


def test_deleting_the_registry_is_no_way_to_lose_the_tools(
    template: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """The obvious way out of a damaged registry, deleting it (and the whole tools dir), deletes no tool."""
    settings = _fresh(template)
    before = _disk(settings)
    shutil.rmtree(settings.cache.tools)
    out, _ = _run(capsys, "clean", "--cache-dir", str(settings.cache_dir), code=1)
    assert "stopped" in out and _disk(settings) == before
    assert sorted(r.name for r in Inventory(settings.cache.tools).all()) == ["te", "te2"]


def test_tools_lost_with_their_workspaces_come_back_from_their_store_entry(
    template: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """The store is evidence: records and workspaces gone, the entry's manifest still names both tools."""
    settings = _fresh(template)
    for name in ("te", "te2"):
        shutil.rmtree(settings.cache.workspaces / name)
    Inventory(settings.cache.tools).remove("te")
    Inventory(settings.cache.tools).remove("te2")
    before = _disk(settings)["store"]
    out, _ = _run(capsys, "clean", "--cache-dir", str(settings.cache_dir), code=1)
    assert "stopped" in out and "2 tools (te, te2)" in out, out
    assert "te: re-registered from its store entry" in out and "its workspace" in out, out
    out, _ = _run(capsys, "clean", "--cache-dir", str(settings.cache_dir))
    assert "stopped" not in out and _disk(settings)["store"] == before, out
    for name in ("te", "te2"):
        assert load(name, cache_dir=str(settings.cache_dir))("hi") == "HI"


def test_a_registry_emptied_of_tools_on_purpose_is_not_taken_for_a_lost_one(
    template: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """An entry that names no tool (no workspace, no card) is no evidence: the empty registry stands, clean proceeds."""
    settings = _fresh(template)
    for name in ("te", "te2"):
        shutil.rmtree(settings.cache.workspaces / name)
    Inventory(settings.cache.tools).remove("te")
    Inventory(settings.cache.tools).remove("te2")
    for manifest in settings.cache.store.glob("*/manifest.json"):  # as an entry no transaction named a tool in
        data = json.loads(manifest.read_text())
        data["tools"] = {}
        manifest.chmod(0o644)
        manifest.write_text(json.dumps(data))
    out, _ = _run(capsys, "clean", "--cache-dir", str(settings.cache_dir), code=1)
    assert "stopped" in out  # once: the store still held entries the inventory never saw
    assert "0 tools (none)" in out
    out, _ = _run(capsys, "clean", "--cache-dir", str(settings.cache_dir))
    assert "stopped" not in out  # reconciled: the leftovers are proven unused now, and go
    assert _disk(settings)["store"] == [] and _disk(settings)["recipes"] == []


def test_a_card_that_does_not_match_its_store_entry_is_not_believed(template: dict[str, Any]) -> None:
    """Tool cards are checked: one pointing at another store entry (or none) gives no record."""
    settings = _fresh(template)
    card = settings.cache.workspaces / "te2" / ".git" / CARD_FILE
    data = json.loads(card.read_text())
    data["record"]["source_hash"] = "0" * 32
    card.write_text(json.dumps(data))
    (settings.cache.tools / DB_NAME).unlink()
    report = doctor(settings)
    # te2's workspace still holds a commit its store entry's manifest names: it is rebuilt from that
    assert report.rebuilt == ["te", "te2"]
    te2 = Inventory(settings.cache.tools).get("te2")
    assert te2 is not None and te2.source_hash == template["records"]["te2"].source_hash
    (settings.cache.workspaces / "te2" / ".git" / "flakebot.json").unlink()  # not a whole fork any more
    card.write_text(json.dumps(data))
    (settings.cache.tools / DB_NAME).unlink()
    report = doctor(settings)
    # no workspace proves te2 now; its store entry still names it, whole: re-registered, the card not believed
    assert report.rebuilt == ["te", "te2"] and not report.skipped
    [note] = [line for line in report.reregistered if line.startswith("te2:")]
    assert "not a whole fork" in note and "source_hash" not in note, note
    te2 = Inventory(settings.cache.tools).get("te2")
    assert te2 is not None and _identity(te2) == _identity(template["records"]["te2"])


def test_doctor_says_what_disagrees_and_deletes_nothing(
    template: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    settings = _fresh(template)
    te = template["records"]["te"]
    Path(te.binary).chmod(0o755)
    Path(te.binary).unlink()
    (Path(te.workspace) / ".git" / "index.lock").write_text("")  # left by a killed git
    out, _ = _run(capsys, "doctor", "--cache-dir", str(settings.cache_dir), code=1)  # a problem remains
    assert "The tool inventory is sound" in out
    # an entry missing its binary is damaged: set aside (kept), and the record says how to build it again
    assert f"set aside {te.store_path}: its binary {te.binary} is gone" in out, out
    # the command's advice names the shell's form (its reader types in a shell)
    assert f"problem: te: its store entry {te.store_path} is gone; `flakebot rebuild te` builds it again" in out
    assert f"removed {Path(te.workspace) / '.git' / 'index.lock'} (a killed git's lock)" in out
    assert sorted(r.name for r in Inventory(settings.cache.tools).all()) == ["te", "te2"]


@pytest.mark.parametrize("how", [*WAYS, "bad-row"])
def test_a_damaged_search_index_breaks_neither_search_nor_a_cached_build(
    template: dict[str, Any], capsys: pytest.CaptureFixture[str], how: str
) -> None:
    settings = _fresh(template)
    opened = DirectoryRegistry(settings.registry, settings.cache_dir)
    assert opened.index_ready()  # built once (the template's search) and found from a fresh cache dir too
    index = opened.index_path
    opened.close()
    if how == "bad-row":
        with sqlite3.connect(index) as db:
            db.execute("UPDATE crates SET bins = '[1, 2' WHERE name = 'tinyecho'")
    else:
        damage(index, how, table="crates")
    out, _ = _run(capsys, "search", "echo", "--cache-dir", str(settings.cache_dir), "--registry", settings.registry)
    assert out.split()[1] == "tinyecho"
    tool = start_build(settings, BuildRequest("", name="te", crate="tinyecho")).wait()  # a recipe hit
    assert str(tool.store_path) == template["records"]["te"].store_path
    with sqlite3.connect(index) as db:  # made again, whole
        assert db.execute("PRAGMA quick_check").fetchone() == ("ok",)


# -- a damaged store entry or workspace (issue 27) ---------------------------------------------------


def _damage_entry(record: ToolRecord, how: str) -> Path:
    """Damage ``record``'s store entry ``how``; the file damaged."""
    target = Path(record.store_path) / "manifest.json" if how.startswith("manifest") else Path(record.binary)
    target.chmod(0o644)
    if how.endswith("empty"):
        target.write_bytes(b"")
    elif how.endswith("random"):
        target.write_bytes(os.urandom(4096))
    else:  # a bit flipped in the middle of the binary
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0x01
        target.write_bytes(bytes(data))
    return target


def _build_argv(settings: Settings, name: str) -> list[str]:
    return [
        *("build", "-q", "--name", name, "--crate", "tinyecho", "--cache-dir", str(settings.cache_dir)),
        *("--registry", str(settings.registry), "--backend", "cargo"),
    ]


ENTRY_DAMAGE = ("manifest-empty", "manifest-random", "binary-empty", "binary-flipped")


@pytest.mark.parametrize("how", ENTRY_DAMAGE)
def test_a_damaged_store_entry_is_found_set_aside_and_built_again(
    template: dict[str, Any], how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = _fresh(template)
    te, te2 = template["records"]["te"], template["records"]["te2"]
    damaged = _damage_entry(te, how)
    cache = str(settings.cache_dir)
    if how.startswith("binary"):  # loaded before anyone looked: refused (never run), saying what to do
        with pytest.raises(CacheFileDamaged, match=r"'te' cannot run: .*flakebot rebuild te"):
            load("te", cache_dir=cache)
    out, _ = _run(capsys, "doctor", "--cache-dir", cache, code=1)
    assert f"set aside {te.store_path}" in out, out
    assert str(damaged) in out or "binary" in out, out
    assert f"problem: te: its store entry {te.store_path} is gone; `flakebot rebuild te`" in out, out
    assert not Path(te.store_path).exists()
    assert [p for p in settings.cache.store.iterdir() if p.name.startswith(DAMAGED_PREFIX)], "kept aside"
    # the next build of te makes the entry again; te2, sharing it, is whole again too
    _run(capsys, *_build_argv(settings, "te"))
    for name in ("te", "te2"):
        assert load(name, cache_dir=cache)("hi") == "HI"  # tinyecho upper-cases
    assert Inventory(settings.cache.tools).get("te2") is not None and te2.store_path == te.store_path


@pytest.mark.parametrize("how", ENTRY_DAMAGE)
def test_a_cache_hit_never_serves_a_damaged_entry(
    template: dict[str, Any], how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = _fresh(template)
    te = template["records"]["te"]
    _damage_entry(te, how)
    cache = str(settings.cache_dir)
    # a new name for the same crate: a cache hit, were the entry whole
    _run(capsys, *_build_argv(settings, "te3"))
    for name in ("te", "te2", "te3"):
        assert load(name, cache_dir=cache)("hi") == "HI"  # tinyecho upper-cases
    out, _ = _run(capsys, "doctor", "--cache-dir", cache)
    assert "Every record agrees with its store entry and workspace." in out, out


def test_a_workspace_that_lost_its_git_objects_is_a_problem(
    template: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    settings = _fresh(template)
    te = template["records"]["te"]
    objects = Path(te.workspace) / ".git" / "objects"
    shutil.rmtree(objects)
    objects.mkdir()
    out, _ = _run(capsys, "doctor", "--cache-dir", str(settings.cache_dir), code=1)
    assert f"problem: te: its recorded commit {te.commit[:12]} is not in its workspace" in out, out
    assert "Every record agrees" not in out


def test_every_store_manifest_is_read_through_the_one_reader() -> None:
    """A store manifest read anywhere but :func:`read_cache_json` would meet damage as a raw traceback."""
    package = Path(__file__).parent.parent.parent / "flakebot_magic"
    readers = ("json.loads", "json.load(", ".read_text(", ".read_bytes(", "open(")
    wrong = [
        f"{source.relative_to(package)}:{number}: {line.strip()}"
        for source in sorted(package.rglob("*.py"))
        for number, line in enumerate(source.read_text().splitlines(), 1)
        if '"manifest.json"' in line and any(reader in line for reader in readers)
    ]
    assert not wrong, wrong


LAYOUT = [str(path.relative_to("/c")) for path in CacheLayout(Path("/c")).directories()]


@pytest.mark.parametrize("way", ["file", "dangling-symlink"])
@pytest.mark.parametrize("directory", LAYOUT)
def test_a_cache_directory_that_is_no_directory_is_set_aside_and_made_again(
    template: dict[str, Any], directory: str, way: str, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = _fresh(template)
    path = settings.cache_dir / directory
    if path.is_dir():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if way == "file":
        path.write_text("junk")
    else:
        path.symlink_to(settings.cache_dir / "nowhere")
    cache = str(settings.cache_dir)
    _, err = _run(capsys, "list", "--cache-dir", cache)
    assert f"set aside {path} (it was not a directory)" in err, err
    assert path.is_dir() and not path.is_symlink()
    assert [p for p in path.parent.iterdir() if p.name.startswith(f"{path.name}{NOT_A_DIRECTORY}")], "kept aside"
    # the tools themselves are in store/ and workspaces/: with either gone, problems remain (they say what to run)
    _run(capsys, "doctor", "--cache-dir", cache, code=1 if directory in ("store", "workspaces") else 0)
    _run(capsys, *_build_argv(settings, "te3"))  # the next build works
    assert load("te3", cache_dir=cache)("hi") == "HI"
    if directory not in ("store", "workspaces"):  # those held the tools themselves: the damage took them
        for name in ("te", "te2"):
            assert load(name, cache_dir=cache)("hi") == "HI"


@pytest.mark.parametrize("how", ["moved", "copied"])
def test_a_cache_dir_moved_or_copied_keeps_every_tool_and_every_command_works(
    template: dict[str, Any], how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = _fresh(template)
    place = settings.cache_dir.parent / "another place ü"
    shutil.rmtree(place, ignore_errors=True)
    if how == "moved":
        settings.cache_dir.rename(place)
    else:
        shutil.copytree(settings.cache_dir, place, symlinks=True)
    there = Settings(cache_dir=place, registry=settings.registry, backend="cargo")
    before = _disk(there)
    out, _ = _run(capsys, "clean", "--cache-dir", str(place))
    assert _disk(there) == before, out  # clean removed nothing a record names
    out, _ = _run(capsys, "doctor", "--cache-dir", str(place))
    assert "Every record agrees with its store entry and workspace." in out, out
    listed = json.loads(_run(capsys, "list", "--json", "--cache-dir", str(place))[0])
    assert {t["name"]: t["status"] for t in listed} == {"te": "ready", "te2": "ready"}
    for name in ("te", "te2"):
        record = Inventory(there.cache.tools).get(name)
        assert record is not None and Path(record.store_path).parent == there.cache.store
        assert Path(record.workspace).parent == there.cache.workspaces
        assert load(name, cache_dir=str(place))("hi") == "HI"
    _run(capsys, *_build_argv(there, "te3"))
    assert load("te3", cache_dir=str(place))("hi") == "HI"
    shutil.rmtree(place)


def test_clean_keeps_what_a_record_names_whatever_form_its_path_takes(
    template: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    settings = _fresh(template)
    before = _disk(settings)
    for name, form in (("te", "relative"), ("te2", "elsewhere")):

        def change(record: ToolRecord, form: str = form) -> None:
            for key in ("store_path", "workspace"):
                path = Path(getattr(record, key))
                relative = Path(path.parent.name) / path.name
                setattr(record, key, str(relative if form == "relative" else Path("/elsewhere") / relative))

        Inventory(settings.cache.tools).modify(name, change)
    out, _ = _run(capsys, "clean", "--cache-dir", str(settings.cache_dir))
    assert _disk(settings) == before, out
