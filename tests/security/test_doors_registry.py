"""Row "registry metadata" of the matrix (docs/SECURITY.md): a registry's crates are read as data of any shape.

A directory registry (a ``cargo vendor`` tree someone hands you) is read by the search's index (a crate's
manifest, its tests' sources) and copied by the fork. Its names, versions and texts have their doors already
(``test_untrusted_data.py``, ``test_untrusted_text_doors.py``); here its shape: a crate whose ``tests/`` holds a
tree 1,500 levels deep and a link to a directory outside. Before issue 33 the fork's copy (``shutil.copytree``)
and the index's ``rglob`` recursed into it: a ``RecursionError`` instead of a search and a clear refusal. Here
the search answers, the fork refuses with a ``ForkError`` that says why, the link is never followed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from door_payloads import deep_trees_removed  # noqa: F401  (an autouse fixture)
from tinycrates import crate, write_registry

from flakebot_magic.config import Settings
from flakebot_magic.errors import ForkError
from flakebot_magic.host.trees import Walk
from flakebot_magic.pipeline import Pipeline
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.request import BuildRequest

SECRET = "zq-REGISTRY-OUTSIDE-7702"
DEPTH = 1500


def _burrow(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "leak.rs").write_text(f"// {SECRET}\n#[test]\nfn t() {{}}\n")
    registry = write_registry(
        tmp_path / "reg",
        [
            crate(
                "burrow",
                files={
                    "src/main.rs": 'fn main() { println!("burrow"); }\n',
                    "tests/it.rs": "#[test]\nfn it() {}\n",
                },
            )
        ],
    )
    tests = registry / "burrow-0.1.0" / "tests"
    (tests / "outside").symlink_to(outside)
    where = tests / "deep"
    where.mkdir()
    for _ in range(DEPTH):  # one level at a time (Path.mkdir(parents=True) recurses too)
        where = where / "d"
        where.mkdir()
    (where / "bottom.rs").write_text("#[test]\nfn bottom() {}\n")
    return registry


def test_a_registry_crate_of_any_depth_is_searched_and_refused_clearly(tmp_path: Path) -> None:
    registry_dir = _burrow(tmp_path)
    registry = DirectoryRegistry(registry_dir, tmp_path / "index")
    try:
        found = registry.search("burrow")  # the index reads the crate's tests: no recursion, no link followed
    finally:
        registry.close()
    assert [c.name for c in found] == ["burrow"]
    settings = Settings(cache_dir=tmp_path / "cache", registry=str(registry_dir), backend="cargo", model=None)
    with pytest.raises(ForkError, match="nested more than"):
        Pipeline(settings).run(BuildRequest("", crate="burrow", name="burrow"))
    for directory, _, files in Walk(settings.cache_dir):  # nothing of the outside was copied anywhere
        for name in files:
            path = Path(directory) / name
            assert path.is_symlink() or SECRET not in path.read_text(errors="replace"), path
