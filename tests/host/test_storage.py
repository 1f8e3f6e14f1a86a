"""OS and SQLite errors become FlakebotErrors that say what to do; a full disk, for real, on a small tmpfs.

The full-disk test mounts a tmpfs (so it needs root; elsewhere it is
skipped, saying so), builds a tool there, fills the disk to several levels
of free space and at each one tries a build and the commands a user reaches
for: the build fails with :class:`~flakebot_magic.errors.DiskFull` (how much
it needs, what ``clean`` frees) and frees its build outputs; ``list``,
``show``, ``logs`` and ``clean`` work, and the tool built before is intact.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
from tinycrates import crate, write_registry

from flakebot_magic.cli import main
from flakebot_magic.commands import typed
from flakebot_magic.config import Settings
from flakebot_magic.errors import DiskFull, FlakebotError, StorageError, UsageError
from flakebot_magic.host.storage import FULL_MARGIN, amount, free_bytes, storage_errors, translate
from flakebot_magic.pipeline.background import start_build
from flakebot_magic.records.inventory import Inventory
from flakebot_magic.request import BuildRequest, RunFlags
from flakebot_magic.sandbox.command import release_target

# -- translation, one error at a time --------------------------------------------------------


def test_no_space_is_disk_full_with_the_free_bytes(tmp_path: Path) -> None:
    exc = translate(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x")), "writing x", tmp_path)
    assert isinstance(exc, DiskFull) and exc.errno == errno.ENOSPC
    assert exc.free == free_bytes(tmp_path) > 0
    assert f"writing x failed: the disk holding {tmp_path} is full" in str(exc)
    assert "`flakebot clean`" in str(exc)


def test_a_permission_error_says_whose_cache_it_is(tmp_path: Path) -> None:
    exc = translate(PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "x")), "reading", tmp_path)
    assert type(exc) is StorageError and exc.path == tmp_path / "x"
    assert "Permission denied" in str(exc) and "FLAKEBOT_CACHE_DIR" in str(exc)


def test_a_damaged_database_is_named(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    path.write_bytes(os.urandom(4096))
    with pytest.raises(StorageError) as caught, storage_errors("reading the demo", path):
        with closing(sqlite3.connect(path)) as db:
            db.execute("SELECT 1 FROM sqlite_master").fetchall()
    assert caught.value.code == "SQLITE_NOTADB"
    assert f"reading the demo failed: {path} is damaged" in str(caught.value)
    assert isinstance(caught.value.__cause__, sqlite3.DatabaseError)


def test_flakebot_errors_pass_through_unchanged(tmp_path: Path) -> None:
    error = UsageError("mine")
    with pytest.raises(UsageError) as caught, storage_errors("anything", tmp_path):
        raise error
    assert caught.value is error


# -- a full disk, for real -------------------------------------------------------------------

TMPFS_BYTES = 32 * 1024 * 1024
#: free bytes the disk is left with, in turn: nothing, a little, less than a build needs
LEVELS = (0, 64 * 1024, 512 * 1024, 1024 * 1024, 2 * 1024 * 1024)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs to fill needs root (run the suite as root, as `make test` does)")
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(mount)], check=False)
    if done.returncode != 0:
        pytest.skip("this machine refused to mount a tmpfs (a container without CAP_SYS_ADMIN?)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(mount: Path, leave: int) -> Path:
    """Fill ``mount`` to ENOSPC, then give ``leave`` bytes back; the filler file."""
    filler = mount / "filler"
    with filler.open("wb", buffering=0) as handle:
        block = b"\0" * (1 << 20)
        while True:
            try:
                handle.write(block)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
        for small in (1 << 16, 1 << 12):
            try:
                while True:
                    handle.write(block[:small])
            except OSError:
                pass
    if leave:
        with filler.open("r+b") as handle:
            handle.truncate(max(0, filler.stat().st_size - leave))
    return filler


def _command(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()
    code = main(list(argv))
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "Traceback" not in captured.out + captured.err
    return captured.out


@pytest.mark.cargo
def test_a_full_disk_says_what_to_do_frees_the_failed_build_and_commands_still_work(
    small_disk: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    registry = write_registry(tmp_path / "registry", ["tinyecho"])
    settings = Settings(cache_dir=small_disk / "cache", registry=str(registry), backend="cargo")
    start_build(settings, BuildRequest("", name="te", crate="tinyecho")).wait()
    te = Inventory(settings.cache.tools).get("te")
    assert te is not None
    cache = str(settings.cache_dir)
    rebuild = RunFlags(rebuild=True)  # the same crate, built again under another name: cargo writes target/ again
    # ... all of it: without te's proof, its tests are built again too (a found proof would skip them)
    shutil.rmtree(settings.cache.proofs)

    for leave in LEVELS:
        filler = _fill(small_disk, leave)
        assert free_bytes(small_disk) < FULL_MARGIN
        with pytest.raises(FlakebotError) as caught:
            start_build(settings, BuildRequest("", name="tb", crate="tinyecho", flags=rebuild)).wait()
        error = caught.value
        assert isinstance(error, DiskFull), f"{leave} bytes free: {type(error).__name__}: {error}"
        message = str(error)
        assert f"The disk holding {settings.cache_dir} is full" in message, message
        # what it needs is what the build of te took here (recorded in te's store entry)
        built = json.loads((Path(te.store_path) / "manifest.json").read_text())["build_bytes"]
        assert built > 1_000_000 and f"It needs about {amount(built)} free" in message, message
        assert f"{typed('clean')} can free" in message
        # a full disk is never blamed on the crate (cargo failing for want of space reads as a compile error)
        assert "compile" not in message and "crate's own" not in message and "tests of" not in message, message
        if error.workspace is not None:  # its build outputs were freed; its sources are kept
            assert not (error.workspace / "target").exists()

        # what a user reaches for on a full disk works, and reads only
        assert "te " in _command(capsys, "list", "--cache-dir", cache)
        assert te.commit in _command(capsys, "show", "te", "--cache-dir", cache)
        assert "== build log" in _command(capsys, "logs", "te", "--cache-dir", cache)
        _command(capsys, "clean", "--cache-dir", cache)
        assert Inventory(settings.cache.tools).get("te") == te
        assert subprocess.run([te.binary, "still", "here"], capture_output=True, text=True).stdout == "still here\n"
        filler.unlink()

    # with room again, the build goes through
    tool = start_build(settings, BuildRequest("", name="tb", crate="tinyecho", flags=rebuild)).wait()
    assert tool.name == "tb" and Inventory(settings.cache.tools).get("te") == te


# -- one reader of the cache's JSON (issue 27) -----------------------------------------------------------

#: modules that still parse a JSON file themselves, and why that file is no cache file read through
#: read_cache_json (each catches every error of its own read: no traceback either way)
OWN_JSON_READERS = {
    "registry/embedding.py": "the embedding model's config.json: the model package's file, not the cache's",
    "eval/report.py": "an eval's own report, under --out",
    "eval/results.py": "an eval's results, under --out",
    "eval/hidden.py": "cargo's test report of an eval attempt",
    "testing/openai_script.py": "the fake model server's script (a test double)",
    "backends/nix.py": "probes/nixpkgs.json, a cache of probe answers: any damage is a miss, probed again",
    "edit/state.py": "the edit sessions' state read through the workspace's size-limited read_text",
}


def test_the_cache_json_is_read_through_one_reader() -> None:
    """Store manifests, recipes, tool cards, intents, attempts, fork state: only read_cache_json parses them."""
    package = Path(__file__).parent.parent.parent / "flakebot_magic"
    found = {
        str(source.relative_to(package))
        for source in package.rglob("*.py")
        for line in source.read_text().splitlines()
        if ("json.load" in line or "load_json(" in line) and ("read_text(" in line or "open(" in line)
    }
    assert found == set(OWN_JSON_READERS), sorted(found ^ set(OWN_JSON_READERS))


# -- a full disk met by a child process, and a cache hit on a full disk (issue 34) --------------------------

_SPACETEST_MAIN = r"""fn main() {
    println!("space");
}

#[cfg(test)]
mod tests {
    struct Gone(std::path::PathBuf);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    #[test]
    fn writes_a_scratch_file() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scratch.bin");
        let _gone = Gone(path.clone());
        let mut file = std::fs::File::create(&path).unwrap();
        let block = vec![0u8; 1 << 20];
        for _ in 0..24 {
            std::io::Write::write_all(&mut file, &block).unwrap();
        }
        file.sync_all().unwrap();
    }
}
"""
#: a crate whose test writes 24 MB into its workspace and removes it as it fails: the disk is full while the test
#: runs, and has room again (far above FULL_MARGIN) when flakebot looks
SPACETEST = crate("spacetest", description="Writes a scratch file in its tests", files={"src/main.rs": _SPACETEST_MAIN})


@pytest.mark.cargo
def test_no_space_in_the_tests_output_is_a_full_disk_never_the_crates_failure(small_disk: Path, tmp_path: Path) -> None:
    registry = write_registry(tmp_path / "registry", [SPACETEST])
    settings = Settings(cache_dir=small_disk / "cache", registry=str(registry), backend="cargo")
    filler = _fill(small_disk, 14 * 1024 * 1024)  # room to compile (a few MB), not for the test's 24 MB
    with pytest.raises(FlakebotError) as caught:
        start_build(settings, BuildRequest("", name="sp", crate="spacetest")).wait()
    error = caught.value
    message = str(error)
    assert isinstance(error, DiskFull), f"{type(error).__name__}: {message}"
    assert free_bytes(small_disk) > FULL_MARGIN  # the test removed its file: only its words said the disk was full
    assert "crate's own" not in message and "tests of" not in message and "Failing:" not in message, message
    assert f"The disk holding {settings.cache_dir} is full" in message and "cargo test of sp" in message, message
    assert f"{typed('clean')} can free" in message, message  # what to free
    assert error.workspace is not None and (error.workspace / "src" / "main.rs").is_file()  # its sources kept
    assert not (error.workspace / "target").exists() and not release_target(error.workspace).exists()
    filler.unlink()


@pytest.mark.cargo
@pytest.mark.parametrize("leave", [0, 64 * 1024])
def test_a_cache_hit_works_on_a_full_disk(
    small_disk: Path, tmp_path: Path, leave: int, capsys: pytest.CaptureFixture[str]
) -> None:
    registry = write_registry(tmp_path / "registry", ["tinyecho"])
    settings = Settings(cache_dir=small_disk / "cache", registry=str(registry), backend="cargo")
    start_build(settings, BuildRequest("", name="te", crate="tinyecho")).wait()
    before = Inventory(settings.cache.tools).get("te")
    filler = _fill(small_disk, leave)
    tool = start_build(settings, BuildRequest("", name="te", crate="tinyecho")).wait()  # the same tool, cached
    assert tool("hi") == "HI" and Inventory(settings.cache.tools).get("te") == before
    argv = ["build", "-q", "--name", "te", "--crate", "tinyecho", "--cache-dir", str(settings.cache_dir)]
    assert _command(capsys, *argv, "--registry", str(registry))
    filler.unlink()


def test_a_crate_copied_onto_a_full_disk_is_this_disks_fault_never_the_crates(small_disk: Path, tmp_path: Path) -> None:
    """The fork's copy of a crate met ENOSPC and said "It holds special files ...; choose another crate"."""
    from flakebot_magic.registry.directory import DirectoryRegistry

    registry = DirectoryRegistry(write_registry(tmp_path / "registry", ["tinyecho"]), tmp_path / "cache")
    candidate = registry.get("tinyecho")
    for leave in (0, 4096):
        filler = _fill(small_disk, leave)
        with pytest.raises(DiskFull, match="is full") as caught:
            registry.fetch(candidate, small_disk / f"fork-{leave}")
        assert "choose another crate" not in str(caught.value)
        filler.unlink()
    registry.fetch(candidate, small_disk / "fork")  # with room, the copy is whole
    assert (small_disk / "fork" / "Cargo.toml").is_file()
