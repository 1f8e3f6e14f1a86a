"""A store entry is whole or it is not served: :mod:`flakebot_magic.host.entry` (the one check of a cache hit,
``doctor`` and every client made from a record).

The entries here are made by hand (a manifest and ``bin/``) the way
:func:`~flakebot_magic.stages.deploy.deploy` writes them; ``tests/manage/test_load_damage.py``
damages real deployed tools at each door.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from flakebot_magic.host.entry import binary_digest, entry_damage, forget_verdicts, runnable_damage


def _entry(root: Path, size: int = 4096) -> Path:
    entry = root / "store" / "k-t-1.0.0"
    (entry / "bin").mkdir(parents=True)
    for name, fill in (("t", b"T"), ("u", b"U")):
        (entry / "bin" / name).write_bytes(b"#!/bin/sh\n" + fill * size)
        (entry / "bin" / name).chmod(0o555)  # as deploy makes it: a binary its owner may read and run
    digests = {name: binary_digest(entry / "bin" / name) for name in ("t", "u")}
    (entry / "manifest.json").write_text(json.dumps({"binaries": ["t", "u"], "digests": digests}))
    return entry


def _swap(entry: Path) -> None:
    t, u, tmp = entry / "bin" / "t", entry / "bin" / "u", entry / "bin" / "x"
    shutil.copy2(t, tmp)
    shutil.copy2(u, t)
    shutil.copy2(tmp, u)
    tmp.unlink()


def _flip_byte(binary: Path) -> None:
    """One byte of ``binary`` changed in place, its size and mtime kept: only ctime and content differ."""
    data = bytearray(binary.read_bytes())
    data[-1] ^= 1
    stat = binary.stat()
    binary.write_bytes(bytes(data))
    os.utime(binary, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def _flip(entry: Path) -> None:
    _flip_byte(entry / "bin" / "t")


def _truncate(entry: Path) -> None:
    os.truncate(entry / "bin" / "t", 100)


@pytest.mark.parametrize("damage", [_swap, _flip, _truncate])
def test_a_damaged_binary_is_refused_even_after_a_whole_verdict(tmp_path: Path, damage: object) -> None:
    forget_verdicts()
    entry = _entry(tmp_path)
    assert entry_damage(entry) == "" and runnable_damage(entry, entry / "bin" / "t") == ""
    damage(entry)  # type: ignore[operator]
    assert "not the one deployed" in entry_damage(entry)
    assert "not the one deployed" in runnable_damage(entry, entry / "bin" / "t")  # the kept verdict is not reused
    assert "not the one deployed" in runnable_damage(entry, entry / "bin" / "t")  # nor is damage kept as whole


def test_a_binary_must_be_one_the_entry_lists(tmp_path: Path) -> None:
    entry = _entry(tmp_path)
    outside = tmp_path / "other"
    outside.write_bytes(b"#!/bin/sh\n")
    assert "is not one its store entry" in runnable_damage(entry, outside)
    assert "is not one its store entry" in runnable_damage(entry, entry / "bin" / "missing")
    assert "cannot be read" in runnable_damage(tmp_path / "gone", tmp_path / "gone" / "bin" / "t")


def test_verdict_is_cached(tmp_path: Path) -> None:
    """Hashing a 64 MB binary on every load is the cost the kept verdict saves: the second check only stats.

    Printed for the report; asserted as a ratio (the machine is shared, absolute times are noise).
    """
    forget_verdicts()
    entry = _entry(tmp_path, size=64 << 20)
    binary = entry / "bin" / "t"
    start = time.perf_counter()
    assert runnable_damage(entry, binary) == ""
    first = time.perf_counter() - start
    (entry / "bin" / "stray").write_bytes(b"x")  # no manifest lists it: the verdict did not read it, and stays
    start = time.perf_counter()
    for _ in range(10):
        assert runnable_damage(entry, binary) == ""
    again = (time.perf_counter() - start) / 10
    print(f"check of a 2x64 MB entry: first {first * 1e3:.1f} ms (hash), then {again * 1e3:.2f} ms (kept verdict)")
    assert again < first / 5


def _flip_other(entry: Path) -> None:
    """The binary not run: one byte changed, its size and mtime kept."""
    _flip_byte(entry / "bin" / "u")


def _replace_by_rename(entry: Path) -> None:
    """Another file of the same size renamed over the binary, its mtime set to the old one's."""
    binary, fake = entry / "bin" / "t", entry / "bin" / ".t.new"
    stat = binary.stat()
    fake.write_bytes(b"#!/bin/sh\n" + b"X" * (stat.st_size - 10))
    os.utime(fake, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.replace(fake, binary)


def _manifest_rewritten(entry: Path) -> None:
    """The manifest's recorded digest of the binary changed (same length), its mtime set back."""
    manifest = entry / "manifest.json"
    stat = manifest.stat()
    data = json.loads(manifest.read_text())
    digest = data["digests"]["t"]["sha256"]
    data["digests"]["t"]["sha256"] = ("0" if digest[0] != "0" else "1") + digest[1:]
    manifest.write_text(json.dumps(data))
    os.utime(manifest, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def _bin_swapped_for_a_link(entry: Path) -> None:
    """``bin/`` moved aside and replaced by a link to a directory holding other files of the same names."""
    elsewhere = entry.parent / "elsewhere"
    shutil.copytree(entry / "bin", elsewhere)
    _flip_byte(elsewhere / "t")
    (entry / "bin").rename(entry.parent / "old-bin")
    (entry / "bin").symlink_to(elsewhere)


@pytest.mark.parametrize(
    "damage", [_swap, _flip, _truncate, _flip_other, _replace_by_rename, _manifest_rewritten, _bin_swapped_for_a_link]
)
def test_every_file_a_kept_verdict_read_is_checked_again_at_the_next_call(tmp_path: Path, damage: object) -> None:
    """The invariant of the kept verdict: after a whole verdict, any change to what it read (the manifest, a
    binary it lists, the one run, the directory they are reached through) is refused at the very next check,
    with sizes and mtimes kept: the stamp holds device, inode and ctime, which no user sets back."""
    forget_verdicts()
    entry = _entry(tmp_path)
    binary = entry / "bin" / "t"
    for _ in range(3):  # found whole, then kept
        assert runnable_damage(entry, binary) == ""
    damage(entry)  # type: ignore[operator]
    why = runnable_damage(entry, binary)
    assert "not the one deployed" in why or "damaged" in why, why
    assert runnable_damage(entry, binary) == why  # damage is never kept as whole
    forget_verdicts()
    assert runnable_damage(entry, binary) == why  # the same answer as a fresh check


def test_a_gone_entry_or_binary_after_a_whole_verdict(tmp_path: Path) -> None:
    forget_verdicts()
    entry = _entry(tmp_path)
    binary = entry / "bin" / "t"
    assert runnable_damage(entry, binary) == ""
    binary.unlink()
    assert "is gone" in runnable_damage(entry, binary)
    shutil.rmtree(entry)
    assert "cannot be read" in runnable_damage(entry, binary)


def test_a_manifest_naming_a_binary_outside_the_entry_is_damage_and_nothing_outside_is_changed(
    tmp_path: Path,
) -> None:
    """Issue 33 (class A in a cache file): a manifest's binary ``../../../outside`` is no part of the entry: the
    entry is damaged (it says why), and restoring its modes (``doctor``) chmods nothing outside it."""
    from flakebot_magic.host.entry import restore_modes

    entry = _entry(tmp_path)
    outside = tmp_path / "outside"
    outside.write_text("the person's file\n")
    outside.chmod(0o200)  # its owner may not read it: restoring the entry's modes must leave that alone
    manifest = json.loads((entry / "manifest.json").read_text())
    manifest["binaries"].append("../../../outside")
    (entry / "manifest.json").write_text(json.dumps(manifest))
    forget_verdicts()
    assert "not a plain name" in entry_damage(entry)
    restore_modes(entry)
    assert oct(outside.stat().st_mode & 0o777) == oct(0o200)
