"""Issue 37 (and 39's clock): a registry's search index is built once per machine and registry, shared by every
cache dir (flakebot_magic/registry/shared_index.py).

Properties: a fresh cache dir builds no index when one is built; the machine's place is read by everyone and
written only on purpose; a place or a file somebody else could write is never read; two builders in two
processes build once; a reader keeps the index it opened while a new one replaces it; a cache dir whose
places above cannot be used still works, alone; a build tells its progress, from 0 to the whole.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from tinycrates import crate, write_crate, write_registry

from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.registry.shared_index import build_lock, index_places, trusted_dir, trusted_file


@pytest.fixture
def registry_dir(tmp_path: Path) -> Path:
    return write_registry(tmp_path / "registry", ["tinyecho", "tinylib"])


def _opened(registry_dir: Path, cache: Path, system: Path, user: Path) -> DirectoryRegistry:
    return DirectoryRegistry(registry_dir, cache, places=index_places(cache, system=system, user=user), system=system)


class Calls:
    """A progress callback that keeps what it was told."""

    def __init__(self) -> None:
        self.told: list[tuple[int, int]] = []

    def __call__(self, done: int, total: int) -> None:
        self.told.append((done, total))


def test_a_fresh_cache_dir_builds_no_index(registry_dir: Path, tmp_path: Path) -> None:
    system, user = tmp_path / "system", tmp_path / "home" / "index"
    first = _opened(registry_dir, tmp_path / "cache1", system, user)
    built = Calls()
    first.prepare_index(built)
    assert built.told and built.told[0][0] == 0 and built.told[-1][0] == built.told[-1][1]  # 0 to the whole
    assert [d for d, _ in built.told] == sorted(d for d, _ in built.told)  # it only goes forward
    assert first.index_path.parent == user and not system.exists()  # the machine's place is never written by a build
    first.close()
    second = _opened(registry_dir, tmp_path / "cache2", system, user)
    assert second.index_ready()
    again = Calls()
    second.prepare_index(again)
    assert again.told == []  # found: nothing built inside the clock
    assert second.index_path == first.index_path
    assert [c.name for c in second.search("echo")][0] == "tinyecho"
    assert not (tmp_path / "cache2" / "index").exists()
    second.close()


def test_the_machines_place_is_read_by_all_and_written_on_purpose(registry_dir: Path, tmp_path: Path) -> None:
    system, user = tmp_path / "system", tmp_path / "home" / "index"
    system.mkdir(mode=0o755)
    installer = _opened(registry_dir, tmp_path / "root-cache", system, user)
    path = installer.build_index(system)
    installer.close()
    assert path.parent == system and stat.S_IMODE(path.stat().st_mode) == 0o644
    reader = _opened(registry_dir, tmp_path / "cache", system, user)
    assert reader.index_ready() and reader.index_path == path
    assert [c.name for c in reader.search("echo")][0] == "tinyecho"
    reader.close()
    assert not user.exists()  # nothing built for the user


@pytest.mark.parametrize("how", ["dir-writable-by-others", "file-writable-by-others", "file-a-symlink", "other-owner"])
def test_an_index_somebody_else_could_write_is_never_read(registry_dir: Path, tmp_path: Path, how: str) -> None:
    """An index names the directory of each crate's source: a planted one could send a build to other code."""
    system, user = tmp_path / "system", tmp_path / "home" / "index"
    system.mkdir(mode=0o755)
    planted = _opened(registry_dir, tmp_path / "c0", system, user)
    path = planted.build_index(system)
    planted.close()
    if how == "dir-writable-by-others":
        system.chmod(0o777)
    elif how == "file-writable-by-others":
        path.chmod(0o666)
    elif how == "file-a-symlink":
        elsewhere = tmp_path / "elsewhere.sqlite"
        path.rename(elsewhere)
        path.symlink_to(elsewhere)
    else:
        if os.geteuid() != 0:
            pytest.skip("chown to another user needs root")
        os.chown(path, 65534, 65534)
    assert not (trusted_dir(system) and trusted_file(path))
    reader = _opened(registry_dir, tmp_path / "cache", system, user)
    assert not reader.index_ready()
    built = Calls()
    reader.prepare_index(built)
    assert built.told and reader.index_path.parent == user  # built again, in a place of its own
    reader.close()


def test_a_cache_dir_alone_still_works(registry_dir: Path, tmp_path: Path) -> None:
    """No machine's index, and a user's place that others may write (or none): the cache dir's own index/."""
    user = tmp_path / "shared-home" / "index"
    user.mkdir(parents=True)
    user.parent.chmod(0o777)  # not sticky: others could replace the place itself
    cache = tmp_path / "cache"
    opened = _opened(registry_dir, cache, tmp_path / "no-system", user)
    assert [c.name for c in opened.search("echo")][0] == "tinyecho"
    assert opened.index_path.parent == cache / "index"
    assert list(user.iterdir()) == []
    opened.close()


def test_a_reader_keeps_its_index_while_a_new_one_replaces_it(registry_dir: Path, tmp_path: Path) -> None:
    system, user = tmp_path / "system", tmp_path / "home" / "index"
    reader = _opened(registry_dir, tmp_path / "c1", system, user)
    assert [c.name for c in reader.search("echo")][0] == "tinyecho"
    old = reader.index_path.stat().st_ino
    write_crate(registry_dir, crate("newcrate", description="A new crate that echoes"))  # the registry changed
    os.utime(registry_dir)
    writer = _opened(registry_dir, tmp_path / "c2", system, user)
    assert "newcrate" in [c.name for c in writer.search("echoes")]
    assert writer.index_path == reader.index_path and writer.index_path.stat().st_ino != old  # replaced
    assert [c.name for c in reader.search("echo")][0] == "tinyecho"  # the old file, still open, still whole
    reader.close()
    writer.close()


def _holds_open(pid: int, path: Path) -> bool:
    """Whether process ``pid`` has ``path`` open (it is waiting for, or holding, the lock)."""
    fds = Path(f"/proc/{pid}/fd")
    try:
        return any(os.readlink(fd) == str(path) for fd in fds.iterdir())
    except OSError:
        return False


_BUILDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from flakebot_magic.registry.directory import DirectoryRegistry
    from flakebot_magic.registry.shared_index import index_places

    registry, cache, system, user = map(Path, sys.argv[1:5])
    built = []
    opened = DirectoryRegistry(
        registry, cache, places=index_places(cache, system=system, user=user), system=system
    )
    opened.prepare_index(lambda done, total: built.append(done))
    print("built" if built else "found", opened.search("echo")[0].name)
    """
)


def test_two_builders_in_two_processes_build_once(tmp_path: Path) -> None:
    many = [f"crate{i:03d}" for i in range(120)]  # enough crates that the first build is still going
    registry_dir = write_registry(
        tmp_path / "registry",
        ["tinyecho", *(crate(n, description=f"the crate {n}", files={"src/lib.rs": ""}) for n in many)],
    )
    system, user = tmp_path / "system", tmp_path / "home" / "index"
    user.mkdir(parents=True, mode=0o700)
    name = _opened(registry_dir, tmp_path / "c", system, user).index.name
    lock = user / f"{name}.lock"
    with build_lock(user, name):  # both start while a build holds the lock: both wait for it, at once
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _BUILDER, str(registry_dir), str(tmp_path / f"c{i}"), str(system), str(user)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(2)
        ]
        deadline = time.monotonic() + 120
        while not all(_holds_open(p.pid, lock) for p in procs):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
            time.sleep(0.05)
    outs = sorted(p.communicate(timeout=300)[0].strip() for p in procs)
    assert all(p.returncode == 0 for p in procs)
    assert outs == ["built tinyecho", "found tinyecho"], outs
    assert [p.name for p in user.iterdir() if p.suffix == ".sqlite"] and not list(user.glob(".*.sqlite.*"))
