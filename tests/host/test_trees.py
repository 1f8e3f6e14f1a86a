"""Trees untrusted code shaped: walked, counted, copied and removed with an explicit stack, no symlink followed."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from door_payloads import deep_trees_removed  # noqa: F401  (an autouse fixture)
from hypothesis import given, settings
from hypothesis import strategies as st

from flakebot_magic.host.fsutil import TooLarge, UnsafePath
from flakebot_magic.host.trees import MAX_DEPTH, OPEN_DIRS, Walk, copy_tree, remove_tree, stat_tree


def deep_tree(root: Path, depth: int, *, files_every: int = 1000) -> None:
    """``root/a/a/.../a`` ``depth`` levels deep (made by descriptors: the path is far past PATH_MAX), a few files
    on the way and at the bottom."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for level in range(depth):
            if level % files_every == 0:
                os.close(os.open(f"f{level}", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
            os.mkdir("a", dir_fd=fd)
            inner = os.open("a", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        bottom = os.open("bottom", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd)
        os.write(bottom, b"x" * 4096)
        os.close(bottom)
    finally:
        os.close(fd)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_tree_ten_thousand_levels_deep_is_walked_counted_copied_and_removed(tmp_path: Path) -> None:
    root = tmp_path / "deep"
    deep_tree(root, 10_000)
    before = _open_fds()
    walk = Walk(root)
    levels = sum(1 for _ in walk)
    assert levels == MAX_DEPTH + 1 and len(walk.too_deep) == 1  # it stops, and says where
    entries = list(stat_tree(root))
    assert len(entries) == 10_000 + 10 + 1  # every directory, every file, the bottom one: none hidden by depth
    assert sum(e.st_size for e in entries if stat.S_ISREG(e.st_mode)) == 4096
    report = copy_tree(root, tmp_path / "copy")
    assert report.left_out == {"/".join(["a"] * (MAX_DEPTH + 1)): f"a directory deeper than {MAX_DEPTH} levels"}
    remove_tree(root)
    remove_tree(tmp_path / "copy")
    assert not root.exists() and not (tmp_path / "copy").exists()
    assert _open_fds() == before  # no descriptor left open


def test_removal_holds_a_bounded_number_of_descriptors(tmp_path: Path) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    deep_tree(tmp_path / "deep", 3 * OPEN_DIRS)
    resource.setrlimit(resource.RLIMIT_NOFILE, (_open_fds() + OPEN_DIRS + 8, hard))
    try:
        assert len(list(stat_tree(tmp_path / "deep"))) > 3 * OPEN_DIRS
        remove_tree(tmp_path / "deep")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert not (tmp_path / "deep").exists()


def test_removal_follows_no_symlink_and_undoes_a_chmod_000(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    tree = tmp_path / "tree"
    (tree / "sub" / "locked" / "inner").mkdir(parents=True)
    (tree / "sub" / "locked" / "inner" / "f").write_text("x")
    (tree / "link").symlink_to(outside)
    (tree / "sub" / "file-link").symlink_to(outside / "keep.txt")
    os.mkfifo(tree / "fifo")
    (tree / "sub" / "locked" / "inner").chmod(0o000)
    (tree / "sub" / "locked").chmod(0o500)
    remove_tree(tree)
    assert not tree.exists()
    assert (outside / "keep.txt").read_text() == "mine"
    # the path itself a symlink: the link goes, never its target
    (tmp_path / "alias").symlink_to(outside)
    remove_tree(tmp_path / "alias")
    assert not os.path.lexists(tmp_path / "alias") and (outside / "keep.txt").exists()
    remove_tree(tmp_path / "missing")  # nothing there: nothing done


def test_copy_tree_copies_bytes_never_through_a_link_and_names_what_it_left(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET")
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "a.rs").write_text("fn a() {}")
    (src / "run.sh").write_text("#!/bin/sh\n")
    (src / "run.sh").chmod(0o755)
    (src / "leak.rs").symlink_to(secret)
    (src / "dir-link").symlink_to(tmp_path)
    os.mkfifo(src / "fifo")
    report = copy_tree(src, tmp_path / "dest")
    dest = tmp_path / "dest"
    assert (dest / "d" / "a.rs").read_text() == "fn a() {}" and os.access(dest / "run.sh", os.X_OK)
    assert not os.path.lexists(dest / "leak.rs") and not os.path.lexists(dest / "dir-link")
    assert set(report.left_out) == {"leak.rs", "dir-link", "fifo"}
    assert "SECRET" not in "".join(p.read_text() for p in dest.rglob("*") if p.is_file())
    kept = copy_tree(src, tmp_path / "with-links", links=True)
    assert os.readlink(tmp_path / "with-links" / "leak.rs") == str(secret)  # the link's text, as a link
    assert set(kept.left_out) == {"fifo"}
    with pytest.raises(TooLarge):
        copy_tree(src, tmp_path / "capped", max_bytes=5)
    (tmp_path / "src-link").symlink_to(src)
    with pytest.raises(UnsafePath):
        copy_tree(tmp_path / "src-link", tmp_path / "through")


@st.composite
def _shapes(draw: st.DrawFn) -> list[tuple[str, str]]:
    """Entries of a small tree: (relative path, kind), kinds file, dir, link-in, link-out."""
    names = st.sampled_from(["a", "b", "c", "src", "x.rs"])
    paths = draw(st.lists(st.lists(names, min_size=1, max_size=4).map("/".join), max_size=12, unique=True))
    return [(p, draw(st.sampled_from(["file", "dir", "link-in", "link-out"]))) for p in paths]


@settings(max_examples=60, deadline=None)
@given(_shapes())
def test_walk_is_os_walk_without_recursion(
    tmp_path_factory: pytest.TempPathFactory, shape: list[tuple[str, str]]
) -> None:
    root = tmp_path_factory.mktemp("walk")
    outside = tmp_path_factory.mktemp("outside")
    for rel, kind in shape:
        path = root / rel
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if kind == "file":
                path.write_text(rel)
            elif kind == "dir":
                path.mkdir(exist_ok=True)
            else:
                path.symlink_to(outside if kind == "link-out" else root)
        except (FileExistsError, NotADirectoryError, IsADirectoryError):
            continue
    ours = [(d, sorted(ds), sorted(fs)) for d, ds, fs in Walk(root)]
    theirs = [(d, sorted(ds), sorted(fs)) for d, ds, fs in os.walk(root)]
    assert sorted(ours) == sorted(theirs)
    counted = sorted((e.st_ino, e.st_mode) for e in stat_tree(root))
    listed = sorted(
        (os.lstat(os.path.join(d, n)).st_ino, os.lstat(os.path.join(d, n)).st_mode)
        for d, ds, fs in theirs
        for n in ds + fs
    )
    assert counted == listed
    remove_tree(root)
    assert not root.exists() and outside.exists()
