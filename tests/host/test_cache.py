"""One cache layout: every directory under the cache dir is named in ``host/cache.py`` alone, and documented.

* read from the source: no other module joins one of those names onto a path (``cache_dir / "journals"``);
* the check is not vacuous: it finds the joins ``host/cache.py`` itself makes, and a module written the old way;
* docs/ARCHITECTURE.md lists every directory;
* ``Settings.cache`` makes the root and every directory private (``0700``, this user's), through ``make_private``;
  one others may write is refused with what to do (no traceback), one they may only read is tightened
  (after a real build, under umask 022: ``tests/security/test_cache_modes.py``).
"""

from __future__ import annotations

import ast
import os
import stat
from pathlib import Path

import pytest

from flakebot_magic.config import Settings
from flakebot_magic.errors import StorageError
from flakebot_magic.host.cache import CACHE_DIRECTORIES, CacheLayout, make_private

PACKAGE = Path(__file__).resolve().parents[2] / "flakebot_magic"
LAYOUT = PACKAGE / "host" / "cache.py"
ARCHITECTURE = PACKAGE.parent / "docs" / "ARCHITECTURE.md"
#: the names under the cache, and the ones under its directories that the layout names too
NAMES = set(CACHE_DIRECTORIES) | {"attempts", ".pending"}


def _joins(source: str, where: str) -> list[str]:
    """Where ``source`` joins a cache directory's name onto a path (``/`` or ``joinpath``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        parts: list[ast.expr] = []
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            parts = [node.right]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "joinpath":
            parts = list(node.args)
        found += [
            f"{where}:{node.lineno} joins {part.value!r}"
            for part in parts
            if isinstance(part, ast.Constant) and part.value in NAMES
        ]
    return found


def test_no_module_builds_a_cache_path_by_hand() -> None:
    suites = PACKAGE / "eval" / "suites"
    outside = [
        hit
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != LAYOUT and suites not in path.parents
        for hit in _joins(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE)))
    ]
    assert outside == [], "name cache directories through flakebot_magic.host.cache.CacheLayout:\n" + "\n".join(outside)


def test_the_check_finds_what_it_forbids() -> None:
    assert len(_joins(LAYOUT.read_text(encoding="utf-8"), "cache.py")) == 2  # attempts/ and .pending/
    old_way = 'a = Path(cache_dir) / "journals" / name\nb = settings.cache_dir.joinpath("locks")\nc = x / "src"\n'
    assert len(_joins(old_way, "old.py")) == 2


def test_architecture_lists_every_directory() -> None:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    missing = [name for name in CACHE_DIRECTORIES if f"`{name}/" not in text]
    assert missing == [], f"docs/ARCHITECTURE.md does not list {missing}"


def test_every_directory_has_its_property() -> None:
    layout = CacheLayout(Path("/c"))
    for name in CACHE_DIRECTORIES:
        assert getattr(layout, name) == Path("/c") / name


def _private(path: Path) -> str | None:
    """Why ``path`` is not a private directory of this user (None: it is)."""
    info = path.lstat() if not path.is_symlink() else path.stat()
    if not stat.S_ISDIR(info.st_mode):
        return f"{path} is not a directory"
    if info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) != 0o700:
        return f"{path}: uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o}"
    return None


def test_settings_make_every_directory_private(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    root.mkdir(mode=0o755)
    root.chmod(0o755)  # a cache made before the rule: readable by others, tightened
    layout = Settings(cache_dir=root).cache
    assert layout.root == root
    assert [why for path in [root, *layout.directories()] if (why := _private(path))] == []


def test_a_fresh_cache_under_missing_parents_is_private(tmp_path: Path) -> None:
    layout = Settings(cache_dir=tmp_path / "a" / "b" / "cache").cache
    assert [why for path in [layout.root, *layout.directories()] if (why := _private(path))] == []


@pytest.mark.parametrize("which", ["root", *CACHE_DIRECTORIES, "attempts"])
@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_a_directory_others_may_write_is_refused_saying_what_to_do(tmp_path: Path, which: str, mode: int) -> None:
    root = tmp_path / "cache"
    layout = CacheLayout(root)
    target = root if which == "root" else layout.attempts if which == "attempts" else getattr(layout, which)
    target.mkdir(parents=True)
    target.chmod(mode)
    planted = target / "planted"
    planted.write_text("anyone's")
    with pytest.raises(StorageError) as caught:
        Settings(cache_dir=root).cache  # noqa: B018 - the property makes the directories
    message = str(caught.value)
    assert str(target) in message and "writable by others" in message and f"chmod 700 {target}" in message
    assert "Traceback" not in message and caught.value.path == target
    assert stat.S_IMODE(target.stat().st_mode) == mode and planted.exists()  # refused, left as it was
    target.chmod(0o700)  # what the message says to do, after checking it
    assert _private(Settings(cache_dir=root).cache.root) is None


def test_a_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give a directory away")
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    os.chown(root, 65534, 65534)
    with pytest.raises(StorageError, match="belongs to another user"):
        make_private(root)


def test_a_file_in_the_layout_is_left_for_doctor(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    (root / "journals").write_text("not a directory")
    (root / "steer").symlink_to(root / "nowhere")
    layout = Settings(cache_dir=root).cache  # the others are made; doctor sets these aside
    assert (root / "journals").is_file() and (root / "steer").is_symlink() and _private(layout.locks) is None
    for path in (root / "journals", root / "steer"):
        with pytest.raises(StorageError, match="doctor"):
            make_private(path)
    assert len(layout.set_aside_non_directories()) == 2
    assert _private(root / "journals") is None and _private(root / "steer") is None


def test_the_cli_says_what_to_do_without_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from flakebot_magic.cli import main

    root = tmp_path / "cache"
    root.mkdir()
    root.chmod(0o777)
    code = main(["list", "--cache-dir", str(root)])
    err = capsys.readouterr().err
    assert code != 0 and f"chmod 700 {root}" in err and "Traceback" not in err


def test_inside_resolves_symlinks_and_dotdot_and_takes_a_layout_dir_where_the_layout_puts_it(tmp_path: Path) -> None:
    """``CacheLayout.inside``: the one confinement check (its doors are in tests/manage/test_confinement.py)."""
    layout = CacheLayout(tmp_path / "cache")
    outside = tmp_path / "outside"
    outside.mkdir()
    layout.workspaces.mkdir(parents=True)
    (layout.workspaces / "link").symlink_to(outside)
    layout.store.symlink_to(outside)  # a layout dir that leads elsewhere: nothing under it is inside
    assert layout.inside(layout.workspaces / "tool", layout.workspaces)
    assert not layout.inside(layout.workspaces, layout.workspaces)  # strictly under
    assert not layout.inside(layout.workspaces / "link" / "x")
    assert not layout.inside(layout.workspaces / "link")  # followed: where it leads
    assert layout.inside(layout.workspaces / "link", follow=False)  # the link itself (removing it removes the link)
    assert not layout.inside(layout.store / "entry", layout.store)
    assert not layout.inside(layout.store / "entry", layout.store, follow=False)
    assert not layout.inside(f"{layout.workspaces}/../../outside/x")
    assert not layout.inside("workspaces/tool") and not layout.inside(layout.root / "..")
    assert not layout.inside(layout.recipes / "r.json", layout.workspaces)  # under the cache, not under its place


def test_a_layout_directory_linked_elsewhere_is_never_changed_through(tmp_path: Path) -> None:
    """The cache dir is made private, never what a layout directory's symlink leads to (it is outside)."""
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o755)
    (root / "store").symlink_to(outside)
    layout = Settings(cache_dir=root).cache
    assert stat.S_IMODE(outside.stat().st_mode) == 0o755  # not tightened through the link
    assert (root / "store").is_symlink() and _private(layout.workspaces) is None
    assert len(layout.set_aside_non_directories()) == 1  # doctor's: the link set aside, the directory made
    assert not (root / "store").is_symlink() and _private(root / "store") is None
    assert stat.S_IMODE(outside.stat().st_mode) == 0o755 and list(outside.iterdir()) == []
