"""Two or three damages at once, then any sequence of ``list``, ``doctor`` and ``clean``: no whole store entry is lost.

The property (issue 34): across any set of two or three simultaneous damages
to the cache's parts (the tool inventory, a workspace, its git objects, its
tool card, its ``.git/config``, an intent, a store manifest, a lock, an
entry's modes), no store entry whose manifest and binaries are as deployed
is removed by any sequence of ``list``, ``doctor`` and ``clean``; no command
shows a traceback; no message names the cache the copy was made from; and
once ``doctor`` is done, every tool whose entry is whole is listed ``ready``
and answers a call as it did before the damage.

One cache is built for real per module (``te`` and ``te2``: one tinyecho
entry under two names, each with its own workspace; ``tr``: a second crate,
its own entry), then copied for each case to another place (so every case is
a copied cache too). Every pair of damages to two different parts is run
with one fixed sequence (the one that removes the most: ``clean`` first, and
after each repair); triples with hypothesis, each with a sequence of its
own. Single damages are ``tests/manage/test_doctor.py``'s.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from damage import damage
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tinycrates import crate, write_registry

from flakebot_magic import load
from flakebot_magic.cli import main
from flakebot_magic.config import Settings
from flakebot_magic.manage.transaction import CARD_FILE
from flakebot_magic.pipeline.background import start_build
from flakebot_magic.records.inventory import DB_NAME, Inventory, ToolRecord
from flakebot_magic.request import BuildRequest

pytestmark = pytest.mark.cargo

_TINYREV_MAIN = r"""use std::io::{Read, Write};

fn main() {
    if std::env::args().nth(1).as_deref() == Some("--help") {
        println!("Usage: tinyrev\nReverses standard input.");
        return;
    }
    let mut input = Vec::new();
    std::io::stdin().read_to_end(&mut input).unwrap();
    input.reverse();
    std::io::stdout().write_all(&input).unwrap();
}
"""
TINYREV = crate("tinyrev", description="Reverse standard input", files={"src/main.rs": _TINYREV_MAIN})
#: each tool and what it answers to "hi" (from standard input)
ANSWERS = {"te": "HI", "te2": "HI", "tr": "ih"}


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("combined")
    registry = write_registry(root / "registry", ["tinyecho", TINYREV])
    built = Settings(cache_dir=root / "built" / "cache", registry=str(registry), backend="cargo")
    start_build(built, BuildRequest("", name="te", crate="tinyecho")).wait()
    start_build(built, BuildRequest("", name="te2", crate="tinyecho")).wait()
    start_build(built, BuildRequest("", name="tr", crate="tinyrev")).wait()
    shutil.copytree(built.cache_dir, root / "template", symlinks=True)
    shutil.rmtree(built.cache_dir)  # what a message names of it must be the copy's
    records = {r.name: r for r in Inventory(Settings(cache_dir=root / "template").cache.tools).all()}
    yield {"root": root, "registry": str(registry), "original": str(built.cache_dir), "records": records}


# -- the damages: each (part, what it does), given the case's settings and records; returns the entries it damaged


def _entry(records: dict[str, ToolRecord], name: str) -> Path:
    return Path(records[name].store_path)


def _unlink_db(s: Settings, r: dict[str, ToolRecord]) -> set[str]:
    for suffix in ("", "-wal", "-shm"):
        s.cache.tools.joinpath(DB_NAME + suffix).unlink(missing_ok=True)
    return set()


def _random_db(s: Settings, r: dict[str, ToolRecord]) -> set[str]:
    damage(s.cache.tools / DB_NAME, "random-bytes", table="tools")
    return set()


def _sql(statement: str) -> Callable[[Settings, dict[str, ToolRecord]], set[str]]:
    def run(s: Settings, r: dict[str, ToolRecord]) -> set[str]:
        with sqlite3.connect(s.cache.tools / DB_NAME) as db:
            db.execute(statement)
        return set()

    return run


def _db_dir(s: Settings, r: dict[str, ToolRecord]) -> set[str]:
    _unlink_db(s, r)
    (s.cache.tools / DB_NAME).mkdir()
    return set()


def _workspace(name: str) -> Callable[[Settings, dict[str, ToolRecord]], set[str]]:
    def run(s: Settings, r: dict[str, ToolRecord]) -> set[str]:
        shutil.rmtree(s.cache.workspaces / name)
        return set()

    return run


def _objects(name: str) -> Callable[[Settings, dict[str, ToolRecord]], set[str]]:
    def run(s: Settings, r: dict[str, ToolRecord]) -> set[str]:
        objects = s.cache.workspaces / name / ".git" / "objects"
        if objects.parent.is_dir():
            shutil.rmtree(objects, ignore_errors=True)
            objects.mkdir()
        return set()

    return run


def _git_file(name: str, file: str, how: str) -> Callable[[Settings, dict[str, ToolRecord]], set[str]]:
    def run(s: Settings, r: dict[str, ToolRecord]) -> set[str]:
        git = s.cache.workspaces / name / ".git"
        if not git.is_dir():
            return set()
        path = git / file
        path.unlink(missing_ok=True)
        if how == "dir":
            (path / "inside").mkdir(parents=True)
        elif how == "garbage":
            path.write_text('{"txn": 1, "record": {"name": "x"')
        return set()

    return run


def _intent(name: str, how: str) -> Callable[[Settings, dict[str, ToolRecord]], set[str]]:
    def run(s: Settings, r: dict[str, ToolRecord]) -> set[str]:
        path = s.cache.intents / f"{name}.json"
        if how == "dir":
            (path / "inside").mkdir(parents=True)
        else:
            path.write_text("{not json")
        return set()

    return run


def _manifest(name: str, how: str) -> Callable[[Settings, dict[str, ToolRecord]], set[str]]:
    def run(s: Settings, r: dict[str, ToolRecord]) -> set[str]:
        manifest = _entry(r, name) / "manifest.json"
        manifest.chmod(0o644)
        if how == "garbage":
            manifest.write_bytes(os.urandom(512))
        else:  # it names no tool any more
            data = json.loads(manifest.read_text())
            data["tools"] = {}
            manifest.write_text(json.dumps(data))
        return {_entry(r, name).name}

    return run


def _lock(name: str, how: str) -> Callable[[Settings, dict[str, ToolRecord]], set[str]]:
    def run(s: Settings, r: dict[str, ToolRecord]) -> set[str]:
        lock = s.cache.locks / f"{name}.lock"
        lock.unlink(missing_ok=True)
        if how == "dir":
            (lock / "inside").mkdir(parents=True)
        elif how == "fifo":
            os.mkfifo(lock)
        else:
            lock.symlink_to(s.cache_dir / "nowhere")
        return set()

    return run


def _modes(name: str) -> Callable[[Settings, dict[str, ToolRecord]], set[str]]:
    def run(s: Settings, r: dict[str, ToolRecord]) -> set[str]:
        Path(r[name].binary).chmod(0)
        _entry(r, name).chmod(0)  # root still reads it; the sandbox, and so a tool's probe, cannot
        return set()

    return run


DAMAGES: dict[str, tuple[str, Callable[[Settings, dict[str, ToolRecord]], set[str]]]] = {
    "inventory-missing": ("inventory", _unlink_db),
    "inventory-random": ("inventory", _random_db),
    "inventory-bad-record": ("inventory", _sql("UPDATE tools SET record = '{\"name\": \"te\", bro' WHERE name='te'")),
    "inventory-lost-row": ("inventory", _sql("DELETE FROM tools WHERE name = 'tr'")),  # an older copy of it
    # a record that parses and names a store entry that is not there (found by the self-attack of issue 34)
    "inventory-wrong-store": (
        "inventory",
        _sql(
            "UPDATE tools SET record = json_set(record, '$.store_path', json_extract(record, '$.store_path') || '-x')"
            " WHERE name = 'tr'"
        ),
    ),
    "inventory-dir": ("inventory", _db_dir),
    "workspace-te": ("workspace", _workspace("te")),
    "workspace-tr": ("workspace", _workspace("tr")),
    "objects-te": ("objects", _objects("te")),
    "objects-tr": ("objects", _objects("tr")),
    "card-te-gone": ("card", _git_file("te", CARD_FILE, "gone")),
    "card-te-dir": ("card", _git_file("te", CARD_FILE, "dir")),
    "card-tr-garbage": ("card", _git_file("tr", CARD_FILE, "garbage")),
    "config-te-dir": ("config", _git_file("te", "config", "dir")),
    "intent-te-dir": ("intent", _intent("te", "dir")),
    "intent-tr-garbage": ("intent", _intent("tr", "garbage")),
    "manifest-tr-garbage": ("manifest", _manifest("tr", "garbage")),
    "manifest-te-unnamed": ("manifest", _manifest("te", "unnamed")),
    "lock-te-dir": ("lock", _lock("te", "dir")),
    "lock-tr-fifo": ("lock", _lock("tr", "fifo")),
    "lock-te2-symlink": ("lock", _lock("te2", "symlink")),
    "modes-te": ("modes", _modes("te")),
}


def _sets(size: int) -> list[tuple[str, ...]]:
    """Every set of ``size`` damages to ``size`` different parts."""
    return [
        combo for combo in itertools.combinations(DAMAGES, size) if len({DAMAGES[name][0] for name in combo}) == size
    ]


PAIRS = _sets(2)
TRIPLES = _sets(3)


# -- one case -------------------------------------------------------------------------------------------


def _contents(entry: Path) -> dict[str, bytes]:
    """What a store entry holds, by relative path (read as root: its modes do not matter here)."""
    return {str(p.relative_to(entry)): p.read_bytes() for p in sorted(entry.rglob("*")) if p.is_file()}


class Case:
    def __init__(self, template: dict[str, Any], damages: tuple[str, ...]) -> None:
        self.template = template
        self.cache = template["root"] / "case" / "cache"
        shutil.rmtree(self.cache.parent, ignore_errors=True)
        self.cache.parent.mkdir(parents=True)
        shutil.copytree(template["root"] / "template", self.cache, symlinks=True)
        self.settings = Settings(cache_dir=self.cache, registry=template["registry"], backend="cargo")
        self.records = {n: r.rebased(self.cache) for n, r in template["records"].items()}
        self.entries = {Path(r.store_path).name: _contents(Path(r.store_path)) for r in self.records.values()}
        damaged: set[str] = set()
        for name in damages:
            damaged |= DAMAGES[name][1](self.settings, self.records)
        #: the entries whose manifest and binaries are as deployed: none of them may go
        self.whole = {name: data for name, data in self.entries.items() if name not in damaged}
        self.said: list[str] = []

    def run(self, capsys: pytest.CaptureFixture[str], command: str) -> int:
        capsys.readouterr()
        code = main([command, "--cache-dir", str(self.cache)])
        out, err = capsys.readouterr()
        said = out + err
        self.said.append(f"$ flakebot {command} -> {code}\n{said}")
        assert "Traceback" not in said, self.story()
        assert self.template["original"] not in said, f"a message names the original cache\n{self.story()}"
        self.check_entries()
        return code

    def check_entries(self) -> None:
        for name, data in self.whole.items():
            entry = self.settings.cache.store / name
            assert entry.is_dir(), f"the whole store entry {name} was removed\n{self.story()}"
            assert _contents(entry) == data, f"the whole store entry {name} changed\n{self.story()}"

    def finish(self, capsys: pytest.CaptureFixture[str]) -> None:
        """After doctor: every tool of a whole entry is listed ready and answers as before; doctor says what is
        left, and exits 1 exactly then."""
        code = self.run(capsys, "doctor")
        problems = [line for line in self.said[-1].splitlines() if line.startswith("problem: ")]
        assert (code == 1) == bool(problems), self.story()
        for line in problems:
            assert "`flakebot rebuild " in line or "`flakebot doctor`" in line, f"no command in {line!r}"
        capsys.readouterr()
        assert main(["list", "--json", "--cache-dir", str(self.cache)]) == 0
        listed = {tool["name"]: tool["status"] for tool in json.loads(capsys.readouterr().out)}
        for name, record in self.records.items():
            if Path(record.store_path).name not in self.whole:
                continue
            assert listed.get(name) == "ready", f"{name}: {listed}\n{self.story()}"
            assert load(name, cache_dir=str(self.cache))("hi") == ANSWERS[name], self.story()
        assert self.run(capsys, "doctor") == code, f"a second doctor found more to do\n{self.story()}"

    def story(self) -> str:
        return "\n".join(self.said)


#: the sequence every pair meets: clean first (the command that removes), and after every repair
WORST = ("clean", "clean", "list", "clean", "doctor", "clean")


@pytest.mark.parametrize("damages", PAIRS, ids=["+".join(pair) for pair in PAIRS])
def test_two_damages_lose_no_whole_store_entry(
    template: dict[str, Any], capsys: pytest.CaptureFixture[str], damages: tuple[str, ...]
) -> None:
    case = Case(template, damages)
    for command in WORST:
        case.run(capsys, command)
    case.finish(capsys)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    damages=st.sampled_from(TRIPLES),
    commands=st.lists(st.sampled_from(["list", "doctor", "clean"]), min_size=1, max_size=5),
)
def test_three_damages_and_any_sequence_lose_no_whole_store_entry(
    template: dict[str, Any], capsys: pytest.CaptureFixture[str], damages: tuple[str, ...], commands: list[str]
) -> None:
    case = Case(template, damages)
    for command in [*commands, "clean"]:
        case.run(capsys, command)
    case.finish(capsys)
