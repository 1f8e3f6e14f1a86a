"""Importing a published crate as data: what is copied, what never is, and the first commit of exactly that."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from flakebot_magic.host.git import Git
from flakebot_magic.host.process import ProcessRunner
from flakebot_magic.stages.source import NEVER_IMPORTED, import_source


@pytest.fixture
def crate_dir(tmp_path: Path) -> Path:
    root = tmp_path / "unpacked"
    (root / "src" / "nested" / ".cargo").mkdir(parents=True)
    (root / "Cargo.toml").write_text('[package]\nname = "x"\nversion = "0.1.0"\n')
    (root / "src" / "main.rs").write_text("fn main() {}\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    (root / ".git").write_text("gitdir: /elsewhere\n")
    (root / ".cargo").mkdir()
    (root / ".cargo" / "config.toml").write_text("[build]\n")
    (root / "src" / "nested" / ".cargo" / "config.toml").write_text("[build]\n")
    (root / "src" / ".gitattributes").write_text("* -diff\n")
    (root / ".gitmodules").write_text("")
    (root / "rust-toolchain").write_text("nightly\n")
    (root / "src" / "rust-toolchain.toml").write_text("[toolchain]\n")
    (root / "src" / "inside").symlink_to("main.rs")
    (root / "src" / "outside").symlink_to("../../../etc/passwd")
    (root / "src" / "absolute").symlink_to("/etc/passwd")
    (root / "src" / "into-cargo").symlink_to("nested/.cargo/config.toml")
    os.mkfifo(root / "pipe")
    (root / "bad\nname").write_text("")
    return root


def test_only_source_is_imported_and_every_drop_is_named(crate_dir: Path, tmp_path: Path) -> None:
    dest = tmp_path / "ws"
    dest.mkdir()
    imported = import_source(crate_dir, dest)
    assert imported.files == ["Cargo.toml", "run.sh", "src/inside", "src/main.rs"]
    assert set(imported.dropped) == {
        ".git",
        ".cargo/",
        "src/nested/.cargo/",
        "src/.gitattributes",
        ".gitmodules",
        "rust-toolchain",
        "src/rust-toolchain.toml",
        "src/outside",
        "src/absolute",
        "src/into-cargo",
        "pipe",
        repr("bad\nname"),
    }
    assert imported.dropped[".git"] == NEVER_IMPORTED[".git"]
    assert "symlink pointing outside" in imported.dropped["src/absolute"]
    assert os.readlink(dest / "src" / "inside") == "main.rs"
    assert os.stat(dest / "run.sh").st_mode & 0o777 == 0o755
    assert os.stat(dest / "Cargo.toml").st_mode & 0o777 == 0o644
    on_disk = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if not p.is_dir() or p.is_symlink())
    assert on_disk == imported.files
    assert "- .cargo/: cargo configuration" in imported.describe()


def test_the_first_commit_records_exactly_the_imported_files(crate_dir: Path, tmp_path: Path) -> None:
    dest = tmp_path / "ws"
    dest.mkdir()
    git = Git(dest, ProcessRunner())
    git.init("published")
    imported = import_source(crate_dir, dest)
    git.commit_files("Published source", imported.files)
    listed = subprocess.run(
        ["git", "ls-tree", "-r", "-z", "HEAD"], cwd=dest, capture_output=True, text=True, check=True
    ).stdout
    recorded = {entry.split("\t")[1]: entry.split()[:3] for entry in listed.split("\0") if entry}
    assert sorted(recorded) == imported.files
    for path, (mode, _, blob) in recorded.items():
        data = os.readlink(dest / path).encode() if (dest / path).is_symlink() else (dest / path).read_bytes()
        assert blob == hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(), path
        assert mode == {"src/inside": "120000", "run.sh": "100755"}.get(path, "100644")
    assert git("status", "--porcelain") == ""  # the index agrees with the work tree


def test_a_new_repository_is_made_only_where_none_is(tmp_path: Path) -> None:
    from flakebot_magic.errors import ForkError

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / ".git").write_text("gitdir: /elsewhere\n")
    with pytest.raises(ForkError, match=r"already holds a \.git"):
        Git(ws, ProcessRunner()).init("published")
