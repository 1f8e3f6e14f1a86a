"""Killed at every crash point, a build, a fork or a clean leaves the next command a whole tool: the old one or the new.

Each case copies one built cache (the tool ``te``, tinyecho), runs a real
build (real git, real cargo in the sandbox) in a child process with
``FLAKEBOT_CRASH_AT=<point>`` so that it ``SIGKILL`` s itself there, then runs
the next command (``flakebot list``, which finishes or undoes what the dead
process left) and checks the invariant with :func:`_consistent`: every
record's store entry has its hash and its binary, its workspace's HEAD is its
commit and carries its tool card, the workspace at that commit builds to that
hash (``store_key`` again), the store entry's manifest names the tool with
that commit, and no transaction is left pending. Which tool the next command
sees (the one before, or the new build) is asserted per point: before the
intent record is durable the old one, from then on the new one.

The scenarios, together, pass every point of
:data:`~flakebot_magic.host.crashpoints.POINTS` but the ``spawn.`` and ``call.`` ones, which are no step on disk (checked below):

* ``rebuild``: ``te`` rebuilt (``--rebuild``: a fresh fork beside it, cargo,
  the same store entry swapped, the workspace swapped);
* ``first``: a first build of ``te2`` (forked in place);
* ``cached``: ``te2`` from the cache under a new name (its own copy of te's
  workspace at te's commit);
* ``reuse``: ``te`` built again in its own workspace (a stale git lock removed);
* ``copy``: the copy a ``--continue`` works on;
* ``clean``: clean removing an unused store entry and an old workspace;
* ``prove``: ``te`` rebuilt with no proof kept (its tests run, their proof is
  written): killed before the proof is written, there is none (the next build
  proves again); after, it is whole.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from tinycrates import write_registry

from flakebot_magic.cli import main
from flakebot_magic.config import Settings
from flakebot_magic.host.crashpoints import ENV, POINTS
from flakebot_magic.host.git import Git
from flakebot_magic.host.locks import tool_lock
from flakebot_magic.host.process import ProcessRunner
from flakebot_magic.manage.transaction import CARD_FILE, Intent, install, pending, read_card, recover
from flakebot_magic.pipeline.background import start_build
from flakebot_magic.records.inventory import Inventory, ToolRecord
from flakebot_magic.records.proof_key import ProofKey
from flakebot_magic.request import BuildRequest, RunFlags
from flakebot_magic.stages.deploy import store_key

ROOT = Path(__file__).resolve().parents[2]

_BUILD = """
    import sys
    from pathlib import Path
    from flakebot_magic.pipeline.background import start_build
    from flakebot_magic.config import Settings
    from flakebot_magic.request import BuildRequest, RunFlags
    cache, registry, name, rebuild = sys.argv[1:5]
    settings = Settings(cache_dir=Path(cache), registry=registry, backend="cargo")
    start_build(settings, BuildRequest("", name=name, crate="tinyecho", flags=RunFlags(rebuild=rebuild == "1"))).wait()
"""
_COPY = """
    import sys
    from pathlib import Path
    from flakebot_magic.sandbox.cargo import Cargo
    from flakebot_magic.events import EventBus
    from flakebot_magic.host.process import ProcessRunner
    from flakebot_magic.registry.directory import DirectoryRegistry
    from flakebot_magic.stages.fork import fork
    cache, registry = Path(sys.argv[1]), DirectoryRegistry(sys.argv[2], Path(sys.argv[1]))
    runner = ProcessRunner()
    fork(registry.get("tinyecho"), registry, cache / "workspaces", "te", runner=runner, bus=EventBus(),
         cargo=Cargo(registry, runner), copy=True)
"""
_CLEAN = """
    import sys
    from pathlib import Path
    from flakebot_magic.manage.cleanup import clean
    from flakebot_magic.config import Settings
    clean(Settings(cache_dir=Path(sys.argv[1]), registry=sys.argv[2]))
"""

#: scenario -> the points it is killed at, and what the next command must see there (``old``/``new``)
FORK_POINTS = ("fork.made", "fork.fetched", "fork.init", "fork.published", "fork.tagged", "fork.branched")
FORK_POINTS += ("fork.satisfiable", "fork.locked", "fork.saved")
DEPLOY_POINTS = ("deploy.staging", "deploy.filled", "deploy.manifest", "deploy.synced", "deploy.swapped", "deploy.done")
TXN_POINTS = ("txn.intent", "txn.card", "txn.swapped", "txn.record", "txn.named", "txn.aside", "txn.recipe")
TXN_POINTS += ("txn.attempt", "txn.done")
CASES: list[tuple[str, str, str]] = [
    *[("rebuild", p, "old") for p in (*FORK_POINTS, *DEPLOY_POINTS)],
    *[("rebuild", p, "new") for p in TXN_POINTS],
    *[("first", p, "none") for p in ("fork.published", "deploy.swapped")],
    ("first", "txn.intent", "new"),
    *[("cached", p, "new") for p in TXN_POINTS],
    *[("reuse", p, "old") for p in ("fork.unlocked", "fork.local_edits")],
    ("copy", "fork.copied", "old"),
    ("clean", "clean.renamed", "old"),
    ("clean", "clean.removed", "old"),
    *[("prove", p, "old") for p in ("proof.proven", "proof.recorded")],
]


def test_the_cases_pass_every_crash_point() -> None:
    # the spawn points are not on disk: tests/security/test_process_trees.py kills a parent at each; the doctor's
    # repairs (and what stands in place of a file, set aside) are killed in tests/manage/test_doctor_crashes.py,
    # a push in tests/backends/test_nix_cache.py
    elsewhere = ("spawn.", "call.", "doctor.", "lock.", "git.", "txn.intent_", "push.")
    assert {point for _, point, _ in CASES} == {p for p in POINTS if not p.startswith(elsewhere)}


def _git(path: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=path, capture_output=True, text=True, check=True).stdout.strip()


def _consistent(settings: Settings) -> dict[str, Any]:
    """The invariant: every record, its store entry and its workspace agree; nothing is left half done."""
    assert list(settings.cache.intents.glob("*.json")) == [], "a transaction is still pending"
    found = {}
    for record in Inventory(settings.cache.tools).all():
        store = Path(record.store_path)
        manifest = json.loads((store / "manifest.json").read_text())
        assert manifest["hash"] == record.source_hash
        binary = Path(record.binary)
        assert binary.parent == store / "bin" and binary.is_file()
        assert subprocess.run([binary, "ok"], capture_output=True, text=True, timeout=30).stdout == "ok\n"
        workspace = Path(record.workspace)
        assert workspace == settings.cache.workspaces / record.name
        assert _git(workspace, "rev-parse", "HEAD") == record.commit
        assert _git(workspace, "status", "--porcelain") == ""
        card = json.loads((workspace / ".git" / CARD_FILE).read_text())
        assert card["record"]["commit"] == record.commit and card["txn"] == record.extra["txn"]
        # the workspace at its commit builds to the store entry the record names
        git = Git(workspace, ProcessRunner())
        assert store_key(git, manifest["rustc"], manifest["flags"], manifest["backend"]) == record.source_hash
        assert manifest["tools"][record.name]["commit"] == record.commit
        assert manifest["tools"][record.name]["workspace"] == record.workspace
        found[record.name] = record
    for entry in settings.cache.store.iterdir():  # no reader ever sees half an entry
        if not entry.name.startswith("."):
            assert (entry / "manifest.json").is_file() and (entry / "bin").is_dir(), entry
    return found


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``te`` built once; each case works on a copy at the same path (records hold absolute paths)."""
    root = tmp_path_factory.mktemp("crash")
    registry = write_registry(root / "registry", ["tinyecho"])
    work = root / "cache"
    settings = Settings(cache_dir=work, registry=str(registry), backend="cargo")
    start_build(settings, BuildRequest("", name="te", crate="tinyecho")).wait()
    before = _consistent(settings)["te"]
    shutil.copytree(work, root / "template", symlinks=True)
    yield {"root": root, "registry": registry, "settings": settings, "te": before}


def _fresh(template: dict[str, Any]) -> Settings:
    settings: Settings = template["settings"]
    shutil.rmtree(settings.cache_dir, ignore_errors=True)
    shutil.copytree(template["root"] / "template", settings.cache_dir, symlinks=True)
    return settings


def _killed_at(point: str, script: str, *args: str) -> None:
    env = {**os.environ, ENV: point, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == -signal.SIGKILL, f"{point} was not reached: {done.returncode} {done.stderr[-2000:]}"


def _next_command(settings: Settings, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """``flakebot list --json`` as a user runs it next (in this process: a fresh one costs a second a case)."""
    capsys.readouterr()
    assert main(["list", "--json", "--cache-dir", str(settings.cache_dir)]) == 0
    return [tool["name"] for tool in json.loads(capsys.readouterr().out)]


@pytest.mark.cargo
@pytest.mark.parametrize(("scenario", "point", "expected"), CASES, ids=[f"{s}-{p}" for s, p, _ in CASES])
def test_a_crash_at_any_point_leaves_a_whole_tool(
    template: dict[str, Any], scenario: str, point: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = _fresh(template)
    cache, registry = str(settings.cache_dir), str(template["registry"])
    old = template["te"]
    name = "te2" if scenario in ("first", "cached") else "te"
    if scenario == "rebuild":
        _killed_at(point, _BUILD, cache, registry, "te", "1")
    elif scenario == "first":
        _killed_at(point, _BUILD, cache, registry, "te2", "1")
    elif scenario == "cached":
        _killed_at(point, _BUILD, cache, registry, "te2", "0")
    elif scenario == "reuse":
        # a git killed mid-commit left its lock; a new crate in the registry makes the recipe miss, so the
        # build reuses te's workspace (and finds the same store entry)
        (Path(old.workspace) / ".git" / "index.lock").write_text("")
        extra = Path(registry) / "zzz-0.0.0"
        stamp = os.stat(registry)
        extra.mkdir()
        try:
            _killed_at(point, _BUILD, cache, registry, "te", "0")
        finally:
            extra.rmdir()
            os.utime(registry, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    elif scenario == "copy":
        _killed_at(point, _COPY, cache, registry)
    elif scenario == "prove":
        shutil.rmtree(settings.cache.proofs)
        _killed_at(point, _BUILD, cache, registry, "te", "1")
    else:
        shutil.copytree(Path(old.store_path), settings.cache.store / f"{'f' * 32}-tinyecho-0.2.0", symlinks=True)
        shutil.copytree(Path(old.workspace), settings.cache.workspaces / ".old" / "te-20240101-000000-000000001")
        _killed_at(point, _CLEAN, cache, registry)

    listed = _next_command(settings, capsys)
    tools = _consistent(settings)
    assert sorted(listed) == sorted(tools)
    te = tools["te"]
    if name == "te":  # the tool the run would have replaced: as it was, or the new build whole
        assert (te.commit == old.commit) == (expected == "old"), (point, te.commit, old.commit)
        if expected == "old":
            assert te.to_json() == old.to_json()  # nothing ready is lost, not even a field of its record
        else:
            assert te.extra["txn"] != old.extra["txn"]
            # the old build's commit still exists: its workspace went to .old/
            [aside] = (settings.cache.workspaces / ".old").iterdir()
            assert _git(aside, "rev-parse", "HEAD") == old.commit
    else:  # te is untouched; te2 is absent or whole
        assert te.to_json() == old.to_json()
        assert ("te2" in tools) == (expected == "new"), (point, sorted(tools))
        if expected == "new":
            assert tools["te2"].forked_by == ("te" if scenario == "cached" else "te2")
        elif scenario == "first":  # what the dead build left does not stand in the way of the next one
            again = BuildRequest("", name="te2", crate="tinyecho", flags=RunFlags(rebuild=True))
            tool = start_build(settings, again).wait()
            assert tool.name == "te2"
            assert sorted(_consistent(settings)) == ["te", "te2"]
    if scenario == "prove":  # the proof is whole (and the next build finds it) or absent, never torn
        proofs = settings.cache.proofs
        records = sorted(p.name for p in proofs.iterdir()) if proofs.exists() else []  # temporary files too
        assert len(records) == (point == "proof.recorded") and all(r.endswith(".json") for r in records), records
        if records:
            key = ProofKey.from_dict(json.loads((settings.cache.proofs / records[0]).read_text())["key"])
            assert key is not None and f"{key.digest()}.json" == records[0]
    if scenario == "reuse":  # the lock a killed git left is gone: it was the first step of the build
        assert not (Path(te.workspace) / ".git" / "index.lock").exists()
    if scenario == "clean":  # the next clean finishes the job
        assert main(["clean", "--cache-dir", cache]) == 0
        assert [e.name for e in settings.cache.store.iterdir()] == [Path(old.store_path).name]
        assert not (settings.cache.workspaces / ".old").exists()
        assert _consistent(settings)["te"].to_json() == old.to_json()


# -- the transaction on its own: a workspace and a store entry made by hand, no cargo -----------------


def _workspace(path: Path, text: str) -> str:
    """A git workspace at ``path`` whose one file holds ``text``; its HEAD."""
    path.mkdir(parents=True)
    (path / "file.txt").write_text(text)
    for argv in (["init", "-q", "-b", "flakebot"], ["add", "-A"], ["commit", "-q", "-m", text]):
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *argv], cwd=path, check=True, capture_output=True
        )
    return _git(path, "rev-parse", "HEAD")


def _entry(settings: Settings, key: str) -> Path:
    entry = settings.cache.store / f"{key}-demo-1.0.0"
    (entry / "bin").mkdir(parents=True)
    (entry / "bin" / "demo").write_text("#!/bin/sh\necho demo\n")
    (entry / "manifest.json").write_text(json.dumps({"hash": key, "binaries": ["demo"], "tools": {}}))
    return entry


def _record(settings: Settings, entry: Path, commit: str, **changes: Any) -> ToolRecord:
    record = ToolRecord(
        name="demo",
        crate="demo",
        version="1.0.0",
        binary=str(entry / "bin" / "demo"),
        store_path=str(entry),
        source_hash=entry.name.split("-")[0],
        checksum="",
        checksum_kind="",
        registry="",
        workspace=str(settings.cache.workspaces / "demo"),
        commit=commit,
    )
    for key, value in changes.items():
        setattr(record, key, value)
    return record


@pytest.fixture
def installed(tmp_path: Path) -> tuple[Settings, ToolRecord]:
    """The tool ``demo`` installed in place: its workspace, card, record and store entry."""
    settings = Settings(cache_dir=tmp_path / "cache")
    commit = _workspace(settings.cache.workspaces / "demo", "old")
    record = install(
        settings, _record(settings, _entry(settings, "a" * 32), commit), settings.cache.workspaces / "demo"
    )
    return settings, record


def test_install_in_place_writes_card_record_and_name(installed: tuple[Settings, ToolRecord]) -> None:
    settings, record = installed
    saved = Inventory(settings.cache.tools).get("demo")
    assert saved is not None and saved.commit == record.commit and saved.extra["txn"] == record.extra["txn"]
    card = read_card(Path(record.workspace))
    assert card is not None and card["txn"] == record.extra["txn"] and card["record"]["commit"] == record.commit
    manifest = json.loads((Path(record.store_path) / "manifest.json").read_text())
    assert manifest["tools"]["demo"] == {
        "commit": record.commit,
        "workspace": record.workspace,
        "forked_by": "demo",
        "txn": record.extra["txn"],  # which of two entries naming one tool named it last (manage/evidence.py)
    }
    assert pending(settings) == []


def test_a_failure_before_the_record_puts_everything_back(installed: tuple[Settings, ToolRecord]) -> None:
    settings, old = installed
    attempt = settings.cache.workspaces / ".next" / "demo-1-2"
    commit = _workspace(attempt / "demo", "new")
    bad = _record(settings, _entry(settings, "b" * 32), commit, status="exploded")  # the inventory refuses it
    with pytest.raises(ValueError, match="status"):
        install(settings, bad, attempt / "demo", replaces=Path(old.workspace))
    assert _git(Path(old.workspace), "rev-parse", "HEAD") == old.commit  # swapped back
    assert _git(attempt / "demo", "rev-parse", "HEAD") == commit  # the attempt is kept for a look
    assert Inventory(settings.cache.tools).get("demo").commit == old.commit  # type: ignore[union-attr]
    assert pending(settings) == []


_INSTALL = """
    import sys, json
    from pathlib import Path
    from flakebot_magic.config import Settings
    from flakebot_magic.records.inventory import ToolRecord
    from flakebot_magic.manage.transaction import install
    settings = Settings(cache_dir=Path(sys.argv[1]))
    record = ToolRecord.from_json(json.loads(sys.argv[2]))
    install(settings, record, Path(sys.argv[3]), replaces=Path(record.workspace))
"""


@pytest.mark.parametrize("gone", ["store entry", "nothing"])
def test_recovery_finishes_a_whole_build_and_undoes_one_whose_store_entry_is_gone(
    installed: tuple[Settings, ToolRecord], gone: str
) -> None:
    settings, old = installed
    attempt = settings.cache.workspaces / ".next" / "demo-1-2"
    commit = _workspace(attempt / "demo", "new")
    entry = _entry(settings, "c" * 32)
    record = _record(settings, entry, commit)
    _killed_at("txn.swapped", _INSTALL, str(settings.cache_dir), json.dumps(record.to_json()), str(attempt / "demo"))
    assert _git(Path(old.workspace), "rev-parse", "HEAD") == commit  # killed between the swap and the record
    if gone == "store entry":
        shutil.rmtree(entry)
    [note] = recover(settings)
    now = Inventory(settings.cache.tools).get("demo")
    assert now is not None and pending(settings) == []
    if gone == "store entry":
        assert note.startswith("undid the build of 'demo'") and f"its store entry {entry} is gone" in note
        assert now.commit == old.commit and _git(Path(old.workspace), "rev-parse", "HEAD") == old.commit
        assert _git(attempt / "demo", "rev-parse", "HEAD") == commit
    else:
        assert note.startswith("finished the build of 'demo'")
        assert now.commit == commit and _git(Path(now.workspace), "rev-parse", "HEAD") == commit
        [aside] = (settings.cache.workspaces / ".old").iterdir()
        assert _git(aside, "rev-parse", "HEAD") == old.commit


def test_recovery_finishes_a_build_whose_cache_dir_was_moved_since(
    installed: tuple[Settings, ToolRecord], tmp_path: Path
) -> None:
    """Killed between the swap and the record, then the whole cache dir moved (a disk change, a copy): the intent
    names the old place, and the next command there finishes the build in the new place."""
    settings, old = installed
    attempt = settings.cache.workspaces / ".next" / "demo-1-2"
    commit = _workspace(attempt / "demo", "new")
    record = _record(settings, _entry(settings, "d" * 32), commit)
    _killed_at("txn.swapped", _INSTALL, str(settings.cache_dir), json.dumps(record.to_json()), str(attempt / "demo"))
    moved = Settings(cache_dir=tmp_path / "elsewhere" / "cache")
    moved.cache_dir.parent.mkdir()
    settings.cache_dir.rename(moved.cache_dir)
    [note] = recover(moved)
    assert note.startswith("finished the build of 'demo'"), note
    now = Inventory(moved.cache.tools).get("demo")
    assert now is not None and pending(moved) == []
    assert now.commit == commit and Path(now.workspace) == moved.cache.workspaces / "demo"
    assert _git(Path(now.workspace), "rev-parse", "HEAD") == commit
    assert Path(now.store_path).parent == moved.cache.store and Path(now.binary).is_file()
    [aside] = (moved.cache.workspaces / ".old").iterdir()
    assert _git(aside, "rev-parse", "HEAD") == old.commit
    assert not settings.cache_dir.exists()  # nothing was written at the old place


def test_recovery_leaves_a_running_build_alone(installed: tuple[Settings, ToolRecord]) -> None:
    settings, _ = installed
    intent = Intent(id="x", name="demo", record={}, final=str(settings.cache.workspaces / "demo"))
    settings.cache.intents.mkdir(parents=True, exist_ok=True)
    (settings.cache.intents / "demo.json").write_text(json.dumps(asdict(intent)))
    with tool_lock(settings.cache, "demo"):  # as the build that wrote it holds it
        assert recover(settings) == []
        assert [i.id for i in pending(settings)] == ["x"]
