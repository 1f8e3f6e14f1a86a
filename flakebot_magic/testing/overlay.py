"""A cargo directory registry that adds local crates to an existing one (Debian's), for tests and demos.

The fixture crates under ``tests/fixtures/`` (an MCP server, an HTTP service)
depend on crates from the offline registry (serde_json, tiny_http). To build
them through the real pipeline, :func:`overlay_registry` makes a directory
holding a symlink to every crate of the base registry plus a copy of each
local crate, with the ``.cargo-checksum.json`` cargo wants::

    registry = overlay_registry(tmp / "registry", [Path("tests/fixtures/demo-mcp")])
    calc = flakebot_magic.build(crate="demo-mcp", name="calc", registry=registry)
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path

__all__ = ["FIXTURES", "fixture_crates_buildable", "overlay_registry"]

#: the fixture crates in a source checkout (absent from an installed package)
FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures"


def fixture_crates_buildable(base: Path | None = None) -> bool:
    """Are the fixture crates here, and the crates they need (serde_json, tiny_http) in ``base``?"""
    from ..config import DEBIAN_REGISTRY

    base = base or DEBIAN_REGISTRY
    return (FIXTURES / "demo-mcp").is_dir() and all(any(base.glob(f"{name}-*")) for name in ("serde_json", "tiny_http"))


def _name_version(crate: Path) -> tuple[str, str]:
    text = (crate / "Cargo.toml").read_text(encoding="utf-8")
    if sys.version_info >= (3, 11):
        import tomllib

        package = tomllib.loads(text)["package"]
    else:  # pragma: no cover
        import tomlkit

        package = tomlkit.parse(text).unwrap()["package"]
    return str(package["name"]), str(package["version"])


def overlay_registry(dest: Path, crates: Iterable[Path], base: Path | None = None) -> Path:
    """``dest``: every crate of ``base`` (symlinked) plus copies of ``crates``; returns ``dest``.

    Re-running with the same crates refreshes their copies (sources that did
    not change keep their modification times, so the search index is reused).
    """
    from ..config import DEBIAN_REGISTRY

    base = base or DEBIAN_REGISTRY
    dest.mkdir(parents=True, exist_ok=True)
    local = {}
    for crate in crates:
        name, version = _name_version(crate)
        local[f"{name}-{version}"] = crate
    if base.is_dir():
        for entry in sorted(base.iterdir()):
            link = dest / entry.name
            if entry.name in local or link.exists() or link.is_symlink():
                continue
            os.symlink(entry, link)
    for dirname, crate in local.items():
        target = dest / dirname
        if target.is_symlink():
            target.unlink()
        staging = dest / f".{dirname}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(crate, staging, ignore=shutil.ignore_patterns("target", "Cargo.lock", ".git"))
        (staging / ".cargo-checksum.json").write_text(json.dumps({"files": {}, "package": None}))
        if target.exists() and _same_tree(staging, target):
            shutil.rmtree(staging)
            continue
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
    return dest


def _same_tree(a: Path, b: Path) -> bool:
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    return files_a == files_b and all((a / f).read_bytes() == (b / f).read_bytes() for f in files_a)
