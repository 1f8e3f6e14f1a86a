"""One cache layout: every directory under the cache dir is named in ``host/cache.py`` alone, and documented.

* read from the source: no other module joins one of those names onto a path (``cache_dir / "journals"``);
* the check is not vacuous: it finds the joins ``host/cache.py`` itself makes, and a module written the old way;
* docs/ARCHITECTURE.md lists every directory;
* ``Settings.cache`` makes the root private (``0700``) before it names anything under it.
"""

from __future__ import annotations

import ast
import stat
from pathlib import Path

from flakebot_magic.config import Settings
from flakebot_magic.host.cache import CACHE_DIRECTORIES, CacheLayout

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


def test_settings_make_the_root_private_first(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    root.mkdir(mode=0o755)
    root.chmod(0o755)
    layout = Settings(cache_dir=root).cache
    assert layout.root == root and stat.S_IMODE(root.stat().st_mode) == 0o700
    assert not layout.journals.exists()  # paths only: each owner creates its own directory


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
