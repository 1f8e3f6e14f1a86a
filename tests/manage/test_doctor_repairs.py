"""The doctor repairs or sets aside every damage it meets, tool by tool, and the smaller items of issue 34.

Each test copies one cache built for real (``te`` and ``te2``: one tinyecho
entry, two workspaces) to another place, damages it, and runs the commands a
user would. What the doctor cannot repair is a problem naming the one command
that does: the test runs that command, and the doctor then finds nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tinycrates import write_registry

from flakebot_magic import load
from flakebot_magic.cli import main
from flakebot_magic.config import Settings
from flakebot_magic.errors import UsageError
from flakebot_magic.manage.transaction import CARD_FILE
from flakebot_magic.pipeline.background import start_build
from flakebot_magic.records.inventory import DB_NAME, Inventory, ToolRecord
from flakebot_magic.request import BuildRequest

pytestmark = pytest.mark.cargo


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("repairs")
    registry = write_registry(root / "registry", ["tinyecho"])
    built = Settings(cache_dir=root / "built", registry=str(registry), backend="cargo")
    start_build(built, BuildRequest("", name="te", crate="tinyecho")).wait()
    start_build(built, BuildRequest("", name="te2", crate="tinyecho")).wait()
    shutil.copytree(built.cache_dir, root / "template", symlinks=True)
    shutil.rmtree(built.cache_dir)
    yield {"root": root, "registry": str(registry), "original": str(built.cache_dir)}


@pytest.fixture
def cache(template: dict[str, Any], tmp_path: Path) -> Settings:
    place = tmp_path / "copy"
    shutil.copytree(template["root"] / "template", place, symlinks=True)
    return Settings(cache_dir=place, registry=template["registry"], backend="cargo")


def _record(settings: Settings, name: str) -> ToolRecord:
    record = Inventory(settings.cache.tools).get(name)
    assert record is not None
    return record


def _run(capsys: pytest.CaptureFixture[str], settings: Settings, *argv: str, code: int = 0) -> tuple[str, str]:
    capsys.readouterr()
    got = main([*argv, "--cache-dir", str(settings.cache_dir)])
    out, err = capsys.readouterr()
    assert got == code, f"exit {got}, not {code}\n{out}\n{err}"
    assert "Traceback" not in out + err
    return out, err


def _rebuild(capsys: pytest.CaptureFixture[str], settings: Settings, name: str) -> None:
    _run(capsys, settings, "rebuild", name, "-q", "--registry", str(settings.registry))


def _sound(capsys: pytest.CaptureFixture[str], settings: Settings) -> str:
    out, _ = _run(capsys, settings, "doctor")
    assert "Every record agrees with its store entry and workspace." in out, out
    for name in ("te", "te2"):
        assert load(name, cache_dir=str(settings.cache_dir))("hi") == "HI"
    return out


def test_a_lock_file_that_is_a_directory_blocks_no_build(cache: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    lock = cache.cache.locks / "te.lock"
    lock.unlink(missing_ok=True)
    (lock / "inside").mkdir(parents=True)
    _, err = _run(capsys, cache, "list")
    assert f"set aside {lock} (it was no lock file)" in err, err
    _rebuild(capsys, cache, "te")  # "Is a directory" for good, before
    (lock.with_name("te2.lock")).unlink(missing_ok=True)
    (lock.with_name("te2.lock") / "inside").mkdir(parents=True)
    _rebuild(capsys, cache, "te2")  # the build itself sets it aside, before any other command
    assert all(path.is_file() for path in cache.cache.locks.glob("*.lock"))
    _sound(capsys, cache)


def test_an_intent_that_is_a_directory_is_set_aside_once(cache: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    intent = cache.cache.intents / "te.json"
    (intent / "inside").mkdir(parents=True)
    (cache.cache.intents / "not a tool.json").write_text("{}")  # a name no build writes: it stopped every command
    _, err = _run(capsys, cache, "list")
    assert f"set aside the damaged intent {intent} (it is no file)" in err, err
    assert "not a tool.json" in err and "no tool name" in err, err
    _, err = _run(capsys, cache, "list")
    assert err == "", err  # once: not a warning on every command, forever
    assert not intent.exists() and [p for p in cache.cache.damaged.iterdir() if p.name.startswith("intent-te-")]
    _sound(capsys, cache)


def test_a_stopped_clean_exits_non_zero(cache: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    (cache.cache.tools / DB_NAME).unlink()
    out, _ = _run(capsys, cache, "clean", code=1)
    assert "flakebot clean stopped" in out, out
    out, _ = _run(capsys, cache, "clean")
    assert "stopped" not in out, out


def test_a_git_config_that_is_a_directory_is_set_aside_and_doctor_goes_on(
    cache: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    config = cache.cache.workspaces / "te" / ".git" / "config"
    config.unlink()
    (config / "inside").mkdir(parents=True)
    card = cache.cache.workspaces / "te2" / ".git" / CARD_FILE
    card.unlink()
    (card / "inside").mkdir(parents=True)
    out, _ = _run(capsys, cache, "doctor")  # it was "doctor failed ... run `flakebot doctor`" before
    assert "te: (.git/config was no file: set aside at" in out and f"set aside {card} (it was no tool card)" in out
    assert f"te2: wrote its tool card {card} again" in out, out
    assert not config.is_dir() and card.is_file()  # git reads a repository without .git/config as init made it
    _sound(capsys, cache)


def test_doctor_checks_each_tool_on_its_own_and_names_the_command_that_works(
    cache: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    """One workspace doctor cannot repair (its .git is a file) stops no other repair; its command works."""
    git = cache.cache.workspaces / "te" / ".git"
    shutil.rmtree(git)
    git.write_text("gitdir: /elsewhere\n")
    lock = cache.cache.workspaces / "te2" / ".git" / "index.lock"
    lock.write_text("")  # a killed git's: repairable
    out, _ = _run(capsys, cache, "doctor", code=1)
    assert f"removed {lock} (a killed git's lock)" in out, out
    problems = [line for line in out.splitlines() if line.startswith("problem: ")]
    assert problems and all(line.startswith("problem: te:") for line in problems), out
    assert all("`flakebot rebuild te`" in line for line in problems), out
    _rebuild(capsys, cache, "te")
    _sound(capsys, cache)


def test_a_tool_doctor_set_aside_is_not_listed_ready(cache: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    te = _record(cache, "te")
    binary = Path(te.binary)
    binary.chmod(0o755)
    binary.write_bytes(b"#!/bin/sh\necho not the build\n")
    out, _ = _run(capsys, cache, "doctor", code=1)  # a problem remains: it exits 1 (it exited 0 before)
    assert f"set aside {te.store_path}" in out and "problem: te:" in out, out
    listed = json.loads(_run(capsys, cache, "list", "--json")[0])
    assert {tool["name"]: tool["status"] for tool in listed} == {"te": "broken", "te2": "broken"}
    with pytest.raises(UsageError) as caught:
        load("te", cache_dir=str(cache.cache_dir))
    message = str(caught.value)
    assert "set it aside" in message and "clean" not in message, message  # it blamed `clean` before
    _rebuild(capsys, cache, "te")
    _sound(capsys, cache)


def test_a_read_only_tools_dir_blocks_neither_list_nor_calls(
    cache: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root (as `make test` runs)")
    tools = cache.cache.tools
    if subprocess.run(["mount", "--bind", str(tools), str(tools)], check=False).returncode != 0:
        pytest.skip("this machine refused a bind mount")
    try:
        assert subprocess.run(["mount", "-o", "remount,ro,bind", str(tools)], check=False).returncode == 0
        out, _ = _run(capsys, cache, "list")
        assert "te " in out and "te2 " in out and "ready" in out, out
        for name in ("te", "te2"):
            assert load(name, cache_dir=str(cache.cache_dir))("hi") == "HI"
        _run(capsys, cache, "show", "te")
        _run(capsys, cache, "clean")
    finally:
        subprocess.run(["umount", "-l", str(tools)], check=False)


def test_a_copied_cache_names_its_own_paths_while_the_original_is_still_there(
    template: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its manifests name the original's workspaces: a cache hit under a new name copied one of those, and said so."""
    original = Settings(cache_dir=tmp_path / "original", registry=template["registry"], backend="cargo")
    start_build(original, BuildRequest("", name="te", crate="tinyecho")).wait()
    copy = Settings(cache_dir=tmp_path / "copy", registry=template["registry"], backend="cargo")
    shutil.copytree(original.cache_dir, copy.cache_dir, symlinks=True)
    (copy.cache.tools / DB_NAME).unlink()  # and what the copy knows of its tools comes from its own disk
    said = []
    for argv in (["list"], ["doctor"], ["build", "--name", "te3", "--crate", "tinyecho"], ["show", "te3"], ["clean"]):
        out, err = _run(capsys, copy, *argv, "--registry", template["registry"])
        said.append(out + err)
    text = "\n".join(said)
    assert str(original.cache_dir) not in text, text
    assert f"its workspace is a copy of {copy.cache.workspaces / 'te'}" in text, text
    record = _record(copy, "te3")
    assert Path(record.store_path).parent == copy.cache.store and Path(record.workspace).parent == copy.cache.workspaces


def test_a_manifest_naming_what_is_no_tool_name_registers_nothing_of_it(
    cache: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    """The store is evidence of tools by the names builds write: a planted ``../x`` is no tool, and stops nothing."""
    manifest = Path(_record(cache, "te").store_path) / "manifest.json"
    data = json.loads(manifest.read_text())
    data["tools"].update({"../x": data["tools"]["te"], "a b": data["tools"]["te"], "class": data["tools"]["te"]})
    manifest.chmod(0o644)
    manifest.write_text(json.dumps(data))
    (cache.cache.tools / DB_NAME).unlink()
    listed = json.loads(_run(capsys, cache, "list", "--json")[0])
    assert sorted(tool["name"] for tool in listed) == ["te", "te2"]
    _sound(capsys, cache)


@pytest.mark.parametrize("where", ["gone", "another tool's"])
def test_a_record_naming_another_store_entry_loses_no_whole_one(
    cache: Settings, where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A record that parses but names an entry that is not its build: the entry its transaction named is kept,
    and the tool is registered from it again."""
    te = _record(cache, "te")
    entry = Path(te.store_path)
    other = cache.cache.store / "0123456789abcdef0123456789abcdef-tinyecho-0.2.0"
    if where != "gone":
        shutil.copytree(entry, other)
        data = json.loads((other / "manifest.json").read_text())
        data["tools"] = {}  # an entry of no tool (another build's)
        (other / "manifest.json").chmod(0o644)
        (other / "manifest.json").write_text(json.dumps(data))

    def elsewhere(record: ToolRecord) -> None:
        record.store_path, record.binary = str(other), str(other / "bin" / "tinyecho")

    for name in ("te", "te2"):
        Inventory(cache.cache.tools).modify(name, elsewhere)
    for _ in range(3):
        capsys.readouterr()
        main(["clean", "--cache-dir", str(cache.cache_dir)])
        assert entry.is_dir(), capsys.readouterr()
    for name in ("te", "te2"):
        assert _record(cache, name).store_path == str(entry)
    _sound(capsys, cache)


def _git_places(git_dir: Path) -> dict[str, Path]:
    """What git opens in a workspace: HEAD, the index, the config, a branch's ref, a loose object."""
    branch = next(p for p in (git_dir / "refs" / "heads").rglob("*") if p.is_file())
    loose = next(p for p in (git_dir / "objects").rglob("*") if p.is_file() and len(p.parent.name) == 2)
    return {
        "HEAD": git_dir / "HEAD",
        "index": git_dir / "index",
        "config": git_dir / "config",
        "branch": branch,
        "object": loose,
    }


def _fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def _zero_link(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.symlink_to("/dev/zero")


def _fifo_link(path: Path) -> None:
    path.unlink(missing_ok=True)
    target = path.parent.parent / f"{path.name}-{os.urandom(4).hex()}.fifo"
    os.mkfifo(target)  # beside, outside what git owns
    path.symlink_to(target)


@pytest.mark.parametrize(
    "special", [_fifo, _zero_link, _fifo_link], ids=["fifo", "link to /dev/zero", "link to a fifo"]
)
def test_no_special_file_where_git_reads_makes_doctor_hang(
    cache: Settings, capsys: pytest.CaptureFixture[str], special: Any
) -> None:
    """Git opens what stands in a workspace's .git; a FIFO there blocked doctor for git's 120 s, per workspace.
    Every place git reads, every kind of special file, in both workspaces at once: doctor removes them (they hold
    no data), finishes in seconds, and what it cannot repair it names, with the command that does."""
    for name in ("te", "te2"):
        for path in _git_places(cache.cache.workspaces / name / ".git").values():
            special(path)
    start = time.monotonic()
    capsys.readouterr()
    code = main(["doctor", "--cache-dir", str(cache.cache_dir)])
    out, err = capsys.readouterr()
    assert time.monotonic() - start < 60, out
    assert "Traceback" not in out + err
    assert "time limit" not in out, out
    for name in ("te", "te2"):
        git_dir = cache.cache.workspaces / name / ".git"
        left = [p for p in git_dir.rglob("*") if p.is_symlink() or not (p.is_file() or p.is_dir())]
        assert left == [], left
    if code != 0:  # an object or the branch's ref was lost: the command doctor names makes the tool again
        for name in ("te", "te2"):
            if f"rebuild {name}" in out:
                _rebuild(capsys, cache, name)
    _sound(capsys, cache)
