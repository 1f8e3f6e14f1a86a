"""The fork stage: published source to git workspace, made buildable offline (real git, real cargo)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from tinycrates import CRATES, Crate, Recorder, crate

from flakebot_magic.config import Settings
from flakebot_magic.errors import ForkError
from flakebot_magic.events import EventBus, Notice
from flakebot_magic.host.process import ProcessRunner
from flakebot_magic.manage.transaction import install
from flakebot_magic.records.inventory import ToolRecord
from flakebot_magic.registry.directory import DirectoryRegistry, read_manifest
from flakebot_magic.sandbox.cargo import Cargo
from flakebot_magic.stages.fork import SKIP_FEATURE, DroppedDependency, Workspace, fork, next_owner

MakeRegistry = Callable[..., DirectoryRegistry]

# every fork settles Cargo.lock with cargo (generate-lockfile / metadata)
pytestmark = pytest.mark.cargo


def _fork(
    registry: DirectoryRegistry,
    root: Path,
    crate_name: str,
    name: str | None = None,
    *,
    bus: EventBus | None = None,
    fresh: bool = False,
    copy: bool = False,
) -> Workspace:
    runner = ProcessRunner()
    return fork(
        registry.get(crate_name),
        registry,
        root / "workspaces",
        name or crate_name,
        runner=runner,
        bus=bus or EventBus(),
        cargo=Cargo(registry, runner),
        fresh=fresh,
        copy=copy,
    )


def git(path: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=path, capture_output=True, text=True, check=True).stdout.strip()


def _subjects(path: Path, revs: str = "published..flakebot") -> list[str]:
    return git(path, "log", "--reverse", "--format=%s", revs).splitlines()


def swap_workspace(workspace: Workspace, bus: EventBus) -> Workspace:
    """Put a workspace built beside the tool's in its place, as a deployed build's transaction does.

    (The record is a stand-in: the transaction's own tests check records, here only the workspaces matter.)
    """
    final = workspace.replaces or workspace.path
    settings = Settings(cache_dir=final.parent.parent)  # the cache whose workspaces/ these are, as in a build
    entry = settings.cache.store / f"{'0' * 32}-{workspace.crate.name}-{workspace.crate.version}"
    (entry / "bin").mkdir(parents=True, exist_ok=True)  # a store entry: a transaction installs a deployed build
    (entry / "manifest.json").write_text(json.dumps({"hash": "0" * 32, "binaries": [], "tools": {}}))
    record = ToolRecord(
        name=final.name,
        crate=workspace.crate.name,
        version=workspace.crate.version,
        binary="",
        store_path=str(entry),
        source_hash="",
        checksum="",
        checksum_kind="",
        registry="",
        workspace=str(final),
        commit=git(workspace.path, "rev-parse", "HEAD"),
    )
    install(
        settings,
        record,
        workspace.path,
        replaces=workspace.replaces,
        keep_replaced=not workspace.reused,
        notice=lambda message: bus.notice("fork", message),
    )
    return Workspace.load(final) or workspace


def _notices(recorder: Recorder) -> list[str]:
    return [e.message for e in recorder.of(Notice)]


# -- the published commit -------------------------------------------------------------


def test_first_commit_is_the_published_source(make_registry: MakeRegistry, tmp_path: Path) -> None:
    registry = make_registry("tinyecho")
    ws = _fork(registry, tmp_path, "tinyecho")
    assert ws.path == tmp_path / "workspaces" / "tinyecho"
    assert git(ws.path, "rev-list", "--count", "published") == "1"
    assert git(ws.path, "rev-parse", "published") == ws.published_commit
    message = git(ws.path, "log", "-1", "--format=%B", "published")
    assert message.splitlines()[0] == "Published source of tinyecho 0.2.0"
    assert f"Registry: {registry.id}" in message
    assert f"Checksum (tree-sha256): {ws.checksum}" in message
    assert (ws.checksum_kind, len(ws.checksum)) == ("tree-sha256", 64)
    assert git(ws.path, "log", "-1", "--format=%an <%ae>", "published") == "flakebot <flakebot@localhost>"


def test_published_commit_holds_every_published_file(make_registry: MakeRegistry, tmp_path: Path) -> None:
    registry = make_registry("tinyecho")
    ws = _fork(registry, tmp_path, "tinyecho")
    tracked = git(ws.path, "ls-tree", "-r", "--name-only", "published").splitlines()
    # data/ is named by the crate's own .gitignore: the published source is committed whole
    assert sorted(tracked) == sorted(["Cargo.toml", *CRATES["tinyecho"].files])
    assert ".cargo-checksum.json" not in tracked


def test_the_checksum_is_reproducible(make_registry: MakeRegistry, tmp_path: Path) -> None:
    registry = make_registry("tinyecho")
    ws = _fork(registry, tmp_path, "tinyecho")
    again = registry.fetch(registry.get("tinyecho"), tmp_path / "again")
    assert again.checksum == ws.checksum


def test_branch_flakebot_is_checked_out_and_clean(make_registry: MakeRegistry, tmp_path: Path) -> None:
    ws = _fork(make_registry("tinyecho"), tmp_path, "tinyecho")
    assert git(ws.path, "rev-parse", "--abbrev-ref", "HEAD") == "flakebot"
    assert git(ws.path, "status", "--porcelain", "--ignored") == ""


def test_a_crate_without_cargo_lock_gets_one(make_registry: MakeRegistry, tmp_path: Path, recorder: Recorder) -> None:
    registry = make_registry("tinyecho")
    ws = _fork(registry, tmp_path, "tinyecho", bus=recorder.bus)
    assert ws.lock_action == "generated"
    assert _subjects(ws.path) == [f"Add Cargo.lock resolved from {registry.id}"]
    # committed although the crate's .gitignore names Cargo.lock
    assert git(ws.path, "ls-files", "Cargo.lock") == "Cargo.lock"
    assert 'name = "tinyecho"' in (ws.path / "Cargo.lock").read_text()
    assert f"generated Cargo.lock from {registry.id}" in _notices(recorder)


def test_the_workspace_state_is_saved(make_registry: MakeRegistry, tmp_path: Path) -> None:
    ws = _fork(make_registry("needsdev"), tmp_path, "needsdev")
    loaded = Workspace.load(ws.path)
    assert loaded is not None and loaded.reused
    assert (loaded.crate, loaded.checksum, loaded.published_commit) == (ws.crate, ws.checksum, ws.published_commit)
    assert (loaded.dropped, loaded.skipped_targets, loaded.lock_action) == (
        ws.dropped,
        ws.skipped_targets,
        ws.lock_action,
    )


# -- dependencies the registry cannot satisfy -------------------------------------------


def test_missing_dev_dependency_is_dropped_in_its_own_commit(
    make_registry: MakeRegistry, tmp_path: Path, recorder: Recorder
) -> None:
    registry = make_registry("needsdev")
    ws = _fork(registry, tmp_path, "needsdev", bus=recorder.bus)
    assert _subjects(ws.path) == [
        "Drop dependencies the registry cannot satisfy",
        f"Add Cargo.lock resolved from {registry.id}",
    ]
    drop = git(ws.path, "rev-list", "--reverse", "published..flakebot").splitlines()[0]
    assert git(ws.path, "show", "--name-only", "--format=", drop) == "Cargo.toml"
    body = git(ws.path, "log", "-1", "--format=%b", drop)
    assert "- missingcrate 1.0 (dev-dependency)" in body
    assert "- test uses_missing (needs missingcrate)" in body
    assert "- example demo (needs missingcrate)" in body

    assert ws.dropped == [DroppedDependency("missingcrate", "missingcrate", "1.0", "dev")]
    assert ws.skipped_targets == ["test uses_missing (needs missingcrate)", "example demo (needs missingcrate)"]
    warnings = [e.message for e in recorder.of(Notice) if e.level == "warning"]
    assert any("missingcrate 1.0" in w for w in warnings)
    assert any("test uses_missing" in w and "example demo" in w for w in warnings)
    assert "missingcrate" not in (ws.path / "Cargo.lock").read_text()


def test_cargo_toml_is_edited_format_preservingly(make_registry: MakeRegistry, tmp_path: Path) -> None:
    ws = _fork(make_registry("needsdev"), tmp_path, "needsdev")
    before = CRATES["needsdev"].manifest.splitlines()
    after = (ws.path / "Cargo.toml").read_text().splitlines()
    removed = [line for line in before if line not in after]
    assert removed == ['missingcrate = "1.0"  # not in the registry']
    # every other line survives, comments included, in its order
    kept = iter(after)
    assert all(line in kept for line in before if line not in removed)

    manifest = read_manifest(ws.path / "Cargo.toml")
    # auto-discovery stays on: only the targets that need the dropped crate are switched off
    assert "autotests" not in manifest["package"] and "autoexamples" not in manifest["package"]
    assert manifest["test"] == [{"name": "uses_missing", "path": "tests/uses_missing.rs", "test": False}]
    assert manifest["example"] == [{"name": "demo", "path": "examples/demo.rs", "required-features": [SKIP_FEATURE]}]
    assert manifest["features"] == {SKIP_FEATURE: []}
    assert "lib" not in manifest and "bin" not in manifest
    assert manifest["dev-dependencies"] == {}


def test_the_kept_test_still_runs_under_cargo_test(make_registry: MakeRegistry, tmp_path: Path) -> None:
    registry = make_registry("needsdev")
    ws = _fork(registry, tmp_path, "needsdev")
    done = Cargo(registry, ProcessRunner()).run("test", "--locked", cwd=ws.path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "test plain_works ... ok" in done.stdout
    assert "uses_it" not in done.stdout


def test_a_test_added_after_the_fork_runs_and_is_counted(make_registry: MakeRegistry, tmp_path: Path) -> None:
    """Dropping a dev-dependency must not switch off tests/ as a whole (issue 9, item 11)."""
    from flakebot_magic.sandbox.diagnostics import parse_test_output

    registry = make_registry("needsdev")
    ws = _fork(registry, tmp_path, "needsdev")
    (ws.path / "tests" / "new_test.rs").write_text("#[test]\nfn the_new_one() {\n    assert_eq!(2 * 2, 4);\n}\n")
    done = Cargo(registry, ProcessRunner()).run("test", "--locked", cwd=ws.path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "test the_new_one ... ok" in done.stdout
    assert "test plain_works ... ok" in done.stdout
    report = parse_test_output(done.stdout.splitlines())
    assert report.passed == 2 and report.failed == 0
    # clippy over every target does not trip on the skipped example either
    lint = Cargo(registry, ProcessRunner()).run("clippy", "--locked", "--all-targets", cwd=ws.path, timeout=300)
    assert lint.returncode == 0, lint.stderr


def test_unit_tests_that_use_a_dropped_crate_are_skipped_per_target(
    make_registry: MakeRegistry, tmp_path: Path
) -> None:
    manifest = (
        '[package]\nname = "unitdev"\nversion = "0.1.0"\nedition = "2021"\n\n[dev-dependencies]\nmissingcrate = "1.0"\n'
    )
    spec = crate(
        "unitdev",
        manifest=manifest,
        files={
            "src/lib.rs": "pub fn one() -> u32 { 1 }\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn t() { missingcrate::x(); }\n}\n",
            "src/main.rs": 'fn main() {\n    println!("{}", unitdev::one());\n}\n\n#[test]\nfn bin_ok() {}\n',
            "tests/fine.rs": "#[test]\nfn fine() { assert_eq!(unitdev::one(), 1); }\n",
        },
    )
    registry = make_registry(spec)
    ws = _fork(registry, tmp_path, "unitdev")
    assert ws.skipped_targets == ["lib unit and doc tests (need missingcrate)"]
    manifest_data = read_manifest(ws.path / "Cargo.toml")
    assert manifest_data["lib"] == {"test": False, "doctest": False}
    assert "test" not in manifest_data and "bin" not in manifest_data
    done = Cargo(registry, ProcessRunner()).run("test", "--locked", cwd=ws.path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "test fine ... ok" in done.stdout and "test bin_ok ... ok" in done.stdout


def test_optional_and_foreign_target_dependencies_are_dropped(make_registry: MakeRegistry, tmp_path: Path) -> None:
    manifest = (
        '[package]\nname = "optdeps"\nversion = "0.1.0"\nedition = "2021"\n\n'
        '[dependencies]\ntinylib = "0.1"\nmissingcrate = { version = "1", optional = true }\n\n'
        "[target.'cfg(windows)'.dependencies]\nwinonly = \"0.3\"\n\n"
        '[features]\ndefault = ["fancy"]\nfancy = ["dep:missingcrate", "plain"]\nplain = []\n'
    )
    registry = make_registry("tinylib", crate("optdeps", manifest=manifest, files={"src/main.rs": "fn main() {}\n"}))
    ws = _fork(registry, tmp_path, "optdeps")
    assert ws.dropped == [
        DroppedDependency("missingcrate", "missingcrate", "1", "optional"),
        DroppedDependency("winonly", "winonly", "0.3", "target"),
    ]
    features = read_manifest(ws.path / "Cargo.toml")["features"]
    assert features == {"default": ["fancy"], "fancy": ["plain"], "plain": []}
    # cargo accepted the edited manifest: the lock was generated from it
    assert ws.lock_action == "generated"
    assert 'name = "tinylib"' in (ws.path / "Cargo.lock").read_text()


def test_a_missing_required_dependency_is_a_fork_error(make_registry: MakeRegistry, tmp_path: Path) -> None:
    manifest = (
        '[package]\nname = "needsmore"\nversion = "0.1.0"\nedition = "2021"\n\n[dependencies]\nmissingcrate = "1"\n'
    )
    registry = make_registry(crate("needsmore", manifest=manifest, files={"src/main.rs": "fn main() {}\n"}))
    with pytest.raises(ForkError) as caught:
        _fork(registry, tmp_path, "needsmore")
    message = str(caught.value)
    assert "needsmore@0.1.0 needs missingcrate 1" in message
    assert "librust-<name>-dev" in message and "--crate" in message
    assert caught.value.workspace == tmp_path / "workspaces" / "needsmore"
    assert caught.value.workspace.is_dir()


# -- Cargo.lock ----------------------------------------------------------------------------


def test_a_lock_pinning_what_the_registry_lacks_is_regenerated(
    make_registry: MakeRegistry, tmp_path: Path, recorder: Recorder
) -> None:
    registry = make_registry("lockpinned", "tinylib")  # tinylib 0.1.3 only; the lock pins 0.1.0
    ws = _fork(registry, tmp_path, "lockpinned", bus=recorder.bus)
    assert ws.lock_action == "regenerated"
    assert _subjects(ws.path) == ["Regenerate Cargo.lock from the registry"]
    body = git(ws.path, "log", "-1", "--format=%b", "flakebot")
    assert f"pins versions the registry {registry.id} lacks" in body
    assert "tinylib 0.1.0" in body
    assert 'version = "0.1.0"' in git(ws.path, "show", "published:Cargo.lock")
    lock = (ws.path / "Cargo.lock").read_text()
    assert 'name = "tinylib"\nversion = "0.1.3"' in lock
    assert any("regenerated Cargo.lock" in n and "tinylib 0.1.0" in n for n in _notices(recorder))


def _lockgood(checksum: str = "") -> Crate:
    manifest = '[package]\nname = "lockgood"\nversion = "0.1.0"\nedition = "2021"\n\n[dependencies]\ntinylib = "0.1"\n'
    lock = (
        "# This file is automatically @generated by Cargo.\n# It is not intended for manual editing.\nversion = 3\n\n"
        '[[package]]\nname = "lockgood"\nversion = "0.1.0"\ndependencies = [\n "tinylib",\n]\n\n'
        '[[package]]\nname = "tinylib"\nversion = "0.1.3"\n'
        'source = "registry+https://github.com/rust-lang/crates.io-index"\n'
        + (f'checksum = "{checksum}"\n' if checksum else "")
    )
    main = 'fn main() {\n    println!("{}", tinylib::shout("ok"));\n}\n'
    return crate("lockgood", manifest=manifest, files={"src/main.rs": main, "Cargo.lock": lock})


def test_a_satisfiable_lock_is_kept(make_registry: MakeRegistry, tmp_path: Path) -> None:
    registry = make_registry(_lockgood(), "tinylib")
    ws = _fork(registry, tmp_path, "lockgood")
    assert ws.lock_action == "kept"
    assert _subjects(ws.path) == []
    assert git(ws.path, "status", "--porcelain") == ""


def test_a_lock_with_checksums_the_registry_cannot_verify_still_builds(
    make_registry: MakeRegistry, tmp_path: Path
) -> None:
    registry = make_registry(_lockgood("ab" * 32), "tinylib")  # crates.io checksums; the registry has none
    ws = _fork(registry, tmp_path, "lockgood")
    done = Cargo(registry, ProcessRunner()).run("build", "--locked", cwd=ws.path, timeout=300)
    assert done.returncode == 0, done.stderr


# -- an existing workspace -------------------------------------------------------------------


def test_re_forking_the_same_crate_reuses_the_workspace(
    make_registry: MakeRegistry, tmp_path: Path, recorder: Recorder
) -> None:
    registry = make_registry("tinyecho")
    first = _fork(registry, tmp_path, "tinyecho")
    (first.path / "notes.txt").write_text("my edits\n")
    again = _fork(registry, tmp_path, "tinyecho", bus=recorder.bus)
    assert again.reused and again.path == first.path
    assert again.published_commit == first.published_commit
    assert (again.path / "notes.txt").read_text() == "my edits\n"
    # the hand edit is committed, so what gets built is in the history
    assert _notices(recorder) == [f"reusing the workspace {first.path}", "committed local edits found in the workspace"]
    assert "Local edits" in git(again.path, "log", "-1", "--format=%s")
    assert not (tmp_path / "workspaces" / ".old").exists()


def test_a_different_crate_under_the_same_name_is_forked_beside_and_swapped_in(
    make_registry: MakeRegistry, tmp_path: Path, recorder: Recorder
) -> None:
    registry = make_registry("tinyecho", "brokenbin")
    old = _fork(registry, tmp_path, "tinyecho", "tool")
    (old.path / "notes.txt").write_text("uncommitted edits\n")
    old_head = git(old.path, "rev-parse", "HEAD")

    new = _fork(registry, tmp_path, "brokenbin", "tool", bus=recorder.bus)
    # forked beside: the tool's workspace is untouched until the new build is deployed
    assert new.path.parent.parent == tmp_path / "workspaces" / ".next" and new.path.name == "tool"
    assert new.path.parent.name.startswith("tool-") and next_owner(new.path.parent) == os.getpid()
    assert new.replaces == old.path and new.crate.name == "brokenbin"
    assert git(old.path, "rev-parse", "HEAD") == old_head
    assert (old.path / "notes.txt").read_text() == "uncommitted edits\n"
    assert f"forking into {new.path}; {old.path} stays as it is until the build succeeds" in _notices(recorder)

    done = swap_workspace(new, recorder.bus)
    assert done.path == old.path and done.replaces is None
    assert "Published source of brokenbin" in git(done.path, "log", "--format=%s", "published")
    assert not any((tmp_path / "workspaces" / ".next").iterdir())
    [aside] = (tmp_path / "workspaces" / ".old").iterdir()
    assert aside.name.startswith("tool-")
    assert (aside / "notes.txt").read_text() == "uncommitted edits\n"
    assert git(aside, "rev-parse", "HEAD") == old_head
    assert f"the previous workspace for 'tool' was moved to {aside}" in _notices(recorder)
    assert Workspace.load(done.path) is not None and Workspace.load(done.path).crate.name == "brokenbin"  # type: ignore[union-attr]


def test_fresh_forks_again_and_keeps_the_old_one(make_registry: MakeRegistry, tmp_path: Path) -> None:
    registry = make_registry("tinyecho")
    first = _fork(registry, tmp_path, "tinyecho")
    (first.path / "notes.txt").write_text("kept aside\n")
    again = _fork(registry, tmp_path, "tinyecho", fresh=True)
    assert not again.reused and again.replaces == first.path
    assert not (again.path / "notes.txt").exists()
    assert (first.path / "notes.txt").read_text() == "kept aside\n"  # until the swap
    done = swap_workspace(again, EventBus())
    assert not (done.path / "notes.txt").exists()
    [aside] = (tmp_path / "workspaces" / ".old").iterdir()
    assert (aside / "notes.txt").read_text() == "kept aside\n"


def test_a_copy_for_continue_leaves_the_workspace_as_it_is(
    make_registry: MakeRegistry, tmp_path: Path, recorder: Recorder
) -> None:
    registry = make_registry("tinyecho")
    first = _fork(registry, tmp_path, "tinyecho")
    head = git(first.path, "rev-parse", "HEAD")
    (first.path / "notes.txt").write_text("a hand edit\n")
    (first.path / "target" / "release").mkdir(parents=True)
    (first.path / "target" / "release" / "big").write_bytes(b"x" * 1000)
    os.mkfifo(first.path / "planted-fifo")  # crate code may leave one; reading it would block the copy

    copy = _fork(registry, tmp_path, "tinyecho", bus=recorder.bus, copy=True)
    assert copy.reused and copy.replaces == first.path and copy.path.parent.parent.name == ".next"
    assert copy.published_commit == first.published_commit
    # the hand edit is committed in the copy only; build outputs and special files are not copied
    assert "Local edits" in git(copy.path, "log", "-1", "--format=%s")
    assert git(first.path, "rev-parse", "HEAD") == head
    assert git(first.path, "status", "--porcelain") != ""
    assert not (copy.path / "target").exists() and not (copy.path / "planted-fifo").exists()

    new_head = git(copy.path, "rev-parse", "HEAD")
    done = swap_workspace(copy, recorder.bus)
    assert done.path == first.path and git(done.path, "rev-parse", "HEAD") == new_head
    # the replaced copy's history is all in the new one: nothing is kept aside
    assert not (tmp_path / "workspaces" / ".old").exists()
    assert not any((tmp_path / "workspaces" / ".next").iterdir())


def test_moving_aside_twice_in_one_second_loses_nothing(make_registry: MakeRegistry, tmp_path: Path) -> None:
    registry = make_registry("tinyecho", "brokenbin")
    _fork(registry, tmp_path, "tinyecho", "tool")
    # the names the next few seconds would give are already taken, as by earlier moves
    now = time.time()
    for second in range(10):
        taken = (
            tmp_path / "workspaces" / ".old" / f"tool-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now + second))}"
        )
        (taken / "tool").mkdir(parents=True)
    new = swap_workspace(_fork(registry, tmp_path, "brokenbin", "tool"), EventBus())
    assert new.crate.name == "brokenbin"
    assert len(list((tmp_path / "workspaces" / ".old").iterdir())) == 11
