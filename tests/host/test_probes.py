"""Probe answers are kept only while what they probed is the same (``host/probes.py``), at every probe that keeps one.

* the cache: an answer is reused while its identity is unchanged, asked again when it changes, a failure is kept
  a short while only, a raised error is never kept, and it holds a bounded number of answers;
* bubblewrap: a real ``bwrap`` behind a script that first fails, then (the script replaced) works: the second
  answer is the new binary's, without a restart;
* the seccomp filter: its file removed, the next sandbox gets it written again;
* nix's sandbox: an edited nix.conf is read again (a fake ``nix show-config``: the seam is the runner).
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from pathlib import Path

import pytest

from flakebot_magic.host import probes
from flakebot_magic.host.probes import ProbeCache, file_identity


def test_an_answer_is_kept_while_its_identity_holds(tmp_path: Path) -> None:
    probed = tmp_path / "binary"
    probed.write_text("one")
    cache: ProbeCache[str, int] = ProbeCache("t", 4)
    answers = iter(range(100))
    assert cache.get("k", file_identity([probed]), lambda: next(answers)) == 0
    assert cache.get("k", file_identity([probed]), lambda: next(answers)) == 0 and cache.probes == 1
    probed.unlink()
    probed.write_text("two, a new file at the same name")
    assert cache.get("k", file_identity([probed]), lambda: next(answers)) == 1 and cache.probes == 2
    os.utime(probed, ns=(1, 1))  # the same inode, touched: a changed mtime is a change too
    assert cache.get("k", file_identity([probed]), lambda: next(answers)) == 2


def test_a_failure_is_kept_a_short_while_only() -> None:
    cache: ProbeCache[str, str] = ProbeCache("t", 4, failed=bool, failure_seconds=0.2)
    answers = iter(["broken", "broken again", ""])
    assert cache.get("k", (), lambda: next(answers)) == "broken"
    assert cache.get("k", (), lambda: next(answers)) == "broken"  # within failure_seconds: kept
    time.sleep(0.3)
    assert cache.get("k", (), lambda: next(answers)) == "broken again"
    time.sleep(0.3)
    assert cache.get("k", (), lambda: next(answers)) == ""
    time.sleep(0.3)
    assert cache.get("k", (), lambda: "never asked") == ""  # a success is kept for good
    assert probes.FAILURE_SECONDS > 0 and ProbeCache("t", 1).failure_seconds == probes.FAILURE_SECONDS


def test_an_error_is_not_kept_and_the_cache_is_bounded() -> None:
    cache: ProbeCache[int, int] = ProbeCache("t", 3)

    def fail() -> int:
        raise RuntimeError("no answer")

    with pytest.raises(RuntimeError):
        cache.get(0, (), fail)
    assert len(cache) == 0 and cache.get(0, (), lambda: 5) == 5
    for key in range(10):
        cache.get(key, (), lambda: 1)
    assert len(cache) == 3
    assert cache.get(0, (), lambda: 9) == 9  # evicted, asked again


def test_an_answer_that_is_no_longer_valid_is_asked_again() -> None:
    cache: ProbeCache[str, list[int]] = ProbeCache("t", 2)
    kept = cache.get("k", (), lambda: [1])
    kept.clear()
    assert cache.get("k", (), lambda: [2], valid=bool) == [2]


def test_bubblewrap_is_asked_again_when_its_binary_changes(tmp_path: Path) -> None:
    from flakebot_magic.sandbox.host import bubblewrap_works

    real = shutil.which("bwrap")
    if real is None or bubblewrap_works():
        pytest.skip("no working bubblewrap here")
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    assert "cannot create a sandbox" in bubblewrap_works(str(fake))
    replaced = tmp_path / "bwrap.new"
    replaced.write_text(f'#!/bin/sh\nexec {real} "$@"\n')
    replaced.chmod(0o755)
    os.replace(replaced, fake)  # the user installed a working one at the same path
    assert bubblewrap_works(str(fake)) == ""


def test_a_removed_seccomp_filter_is_written_again() -> None:
    from flakebot_magic.sandbox.seccomp import SeccompFilter, seccomp_filter

    first = seccomp_filter()
    if not isinstance(first, SeccompFilter):
        pytest.skip(f"no seccomp filter here: {first}")
    first.path.unlink()
    again = seccomp_filter()
    assert isinstance(again, SeccompFilter) and again.path.is_file()
    assert stat.S_IMODE(again.path.stat().st_mode) == 0o600


class _ConfigRunner:
    """A `nix show-config --json` answering from a nix.conf (the seam: nix itself is not run)."""

    def __init__(self, conf: Path) -> None:
        self.conf = conf
        self.calls = 0

    def run(self, argv: list[str], **_: object) -> object:
        from flakebot_magic.host.process import Completed

        self.calls += 1
        on = "sandbox = true" in self.conf.read_text()
        body = '{"sandbox": {"value": %s}, "build-users-group": {"value": "nixbld"}}' % ("true" if on else "false")
        return Completed(argv, 0, body, "", 0.0)


def test_nix_is_asked_again_when_its_conf_changes(tmp_path: Path) -> None:
    from flakebot_magic.backends.nix_command import nix_sandbox

    conf = tmp_path / "nix.conf"
    conf.write_text("sandbox = false\n")
    runner = _ConfigRunner(conf)
    env = {"NIX_CONF_DIR": str(tmp_path), "HOME": str(tmp_path)}
    assert not nix_sandbox("/usr/bin/nix", runner, env=env).on  # type: ignore[arg-type]
    assert not nix_sandbox("/usr/bin/nix", runner, env=env).on and runner.calls == 1  # type: ignore[arg-type]
    conf.write_text("sandbox = true\n")
    assert nix_sandbox("/usr/bin/nix", runner, env=env).on and runner.calls == 2  # type: ignore[arg-type]


def test_the_toolchain_is_asked_again_when_cargo_changes(tmp_path: Path) -> None:
    from flakebot_magic.sandbox import toolchain

    if shutil.which("rustc") is None:
        pytest.skip("no rustc here")
    cargo = tmp_path / "cargo"  # a stand-in: the toolchain is the rustc on PATH
    cargo.write_text("#!/bin/sh\n")
    cargo.chmod(0o755)
    before = toolchain._TOOLCHAINS.probes
    found = toolchain.toolchain_of(str(cargo))
    assert found.sysroot and toolchain.toolchain_of(str(cargo)) == found
    assert toolchain._TOOLCHAINS.probes == before + 1
    cargo.unlink()
    cargo.write_text("#!/bin/sh\n# upgraded\n")
    cargo.chmod(0o755)
    assert toolchain.toolchain_of(str(cargo)) == found  # the same rustc: the same answer, asked again
    assert toolchain._TOOLCHAINS.probes == before + 2
