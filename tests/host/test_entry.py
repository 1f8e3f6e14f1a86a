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
    digests = {name: binary_digest(entry / "bin" / name) for name in ("t", "u")}
    (entry / "manifest.json").write_text(json.dumps({"binaries": ["t", "u"], "digests": digests}))
    return entry


def _swap(entry: Path) -> None:
    t, u, tmp = entry / "bin" / "t", entry / "bin" / "u", entry / "bin" / "x"
    shutil.copy2(t, tmp)
    shutil.copy2(u, t)
    shutil.copy2(tmp, u)
    tmp.unlink()


def _flip(entry: Path) -> None:
    binary = entry / "bin" / "t"
    data = bytearray(binary.read_bytes())
    data[-1] ^= 1
    stat = binary.stat()
    binary.write_bytes(bytes(data))
    os.utime(binary, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size, same mtime: only ctime and content differ


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
    start = time.perf_counter()
    for _ in range(10):
        assert runnable_damage(entry, binary) == ""
    again = (time.perf_counter() - start) / 10
    print(f"check of a 2x64 MB entry: first {first * 1e3:.1f} ms (hash), then {again * 1e3:.2f} ms (kept verdict)")
    assert again < first / 5
