"""Containment: which model paths and manifests the edit loop refuses (the file functions themselves: tests/security)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flakebot_magic.edit.files import PathRefused, check_manifest_text, contain


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    (path / "src").mkdir(parents=True)
    (path / "src" / "main.rs").write_text("fn main() {}\n")
    (tmp_path / "outside").mkdir()
    (path / "escape").symlink_to(tmp_path / "outside")
    (path / "inner").symlink_to(path / "src")
    return path


@pytest.mark.parametrize(
    ("path", "write", "why"),
    [
        ("../outside/x.rs", True, "'..' is not allowed"),
        ("src/../../outside/x.rs", False, "'..' is not allowed"),
        ("/etc/passwd", False, "is absolute"),
        ("~/.bashrc", True, "is absolute"),
        ("escape/x.rs", True, "outside the crate (a symlink leaves it)"),
        ("escape", False, "outside the crate"),
        (".git/config", False, "inside .git/"),
        ("src/.git/hooks/x", True, "inside .git/"),
        (".cargo/config.toml", True, "inside .cargo/"),
        ("rust-toolchain.toml", True, "the toolchain is not the model's"),
        ("rust-toolchain", True, "the toolchain is not the model's"),
        ("build.rs", True, "build scripts run arbitrary code"),
        ("target/debug/x", True, "inside target/"),
        ("", False, "the path is empty"),
        ("src/a\0b.rs", True, "NUL"),
        ("inner", True, "is a symlink"),
    ],
)
def test_model_paths_that_leave_or_touch_what_is_not_theirs_are_refused(
    root: Path, path: str, write: bool, why: str
) -> None:
    with pytest.raises(PathRefused, match=re.escape(why)):
        contain(root, path, write=write)


def test_paths_inside_resolve_and_build_scripts_can_be_allowed(root: Path) -> None:
    assert contain(root, "src/main.rs", write=True) == root.resolve() / "src" / "main.rs"
    assert contain(root, "./src/new/mod.rs", write=True) == root.resolve() / "src" / "new" / "mod.rs"
    assert contain(root, "inner/main.rs") == root.resolve() / "inner" / "main.rs"  # a symlink that stays inside
    assert contain(root, "build.rs", write=True, allow_build_scripts=True).name == "build.rs"
    assert contain(root, "build.rs").name == "build.rs"  # reading one is fine


def test_a_manifest_that_names_a_build_script_or_a_path_outside_is_refused(root: Path) -> None:
    head = '[package]\nname = "x"\nversion = "0.1.0"\n'
    with pytest.raises(PathRefused, match="build script"):
        check_manifest_text(root, head + 'build = "src/gen.rs"\n', allow_build_scripts=False)
    check_manifest_text(root, head + 'build = "src/gen.rs"\n', allow_build_scripts=True)
    with pytest.raises(PathRefused, match=r"dependencies.evil.path: '\.\./outside'"):
        check_manifest_text(root, head + '[dependencies]\nevil = { path = "../outside" }\n', allow_build_scripts=False)
    with pytest.raises(PathRefused, match=r"bin\.path"):
        check_manifest_text(root, head + '[[bin]]\nname = "x"\npath = "/etc/x.rs"\n', allow_build_scripts=False)
    with pytest.raises(PathRefused, match="not valid TOML"):
        check_manifest_text(root, head + "[[[", allow_build_scripts=False)
    check_manifest_text(root, head + '[[bin]]\nname = "x"\npath = "src/main.rs"\n', allow_build_scripts=False)
