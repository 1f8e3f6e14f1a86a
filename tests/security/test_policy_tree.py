"""The build policy on a tree on disk: each thing code could plant is refused, by name; the published crate is not."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flakebot_magic.errors import PolicyError
from flakebot_magic.host.git import Git
from flakebot_magic.host.process import ProcessRunner
from flakebot_magic.sandbox.policy import Baseline, Violation, check_manifest, check_tree, enforce

HEAD = '[package]\nname = "x"\nversion = "0.1.0"\nedition = "2021"\n'


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "Cargo.toml").write_text(HEAD)
    (root / "src" / "lib.rs").write_text("pub fn one() -> u8 { 1 }\n")
    (tmp_path / "outside").mkdir()
    return root


def _reasons(root: Path, **options: object) -> dict[str, str]:
    return {v.path: v.reason for v in check_tree(root, **options)}  # type: ignore[arg-type]


def test_a_clean_crate_passes(ws: Path) -> None:
    (ws / "target" / "debug" / ".cargo").mkdir(parents=True)  # cargo's outputs are not walked
    (ws / "src" / "inner").symlink_to(ws / "src")  # a symlink that stays inside is fine
    assert check_tree(ws) == []


@pytest.mark.parametrize(
    ("plant", "path", "reason"),
    [
        (lambda r: (r / "build.rs").write_text("fn main() {}"), "build.rs", "a build script"),
        (
            lambda r: (
                (r / ".cargo").mkdir() or (r / ".cargo" / "config.toml").write_text('[target.x]\nrunner = "sh"\n')
            ),
            ".cargo",
            "a .cargo/ directory",
        ),
        (lambda r: (r / "src" / ".cargo").mkdir(), "src/.cargo", "a .cargo/ directory"),
        (
            lambda r: (r / "rust-toolchain.toml").write_text('[toolchain]\npath = "/evil"\n'),
            "rust-toolchain.toml",
            "toolchain",
        ),
        (lambda r: (r / "rust-toolchain").write_text("nightly\n"), "rust-toolchain", "toolchain"),
        (lambda r: (r / "src" / "leak").symlink_to(r.parent / "outside"), "src/leak", "symlink pointing outside"),
        (lambda r: (r / "src" / "git").symlink_to(r / ".git"), "src/git", "into .git/"),
        (lambda r: (r / "vendor" / "x" / ".git").mkdir(parents=True), "vendor/x/.git", "nested"),
        (lambda r: (r / ".gitattributes").write_text("*.rs -diff\n"), ".gitattributes", "git reads it"),
        (lambda r: (r / "src" / ".gitattributes").write_text("* binary\n"), "src/.gitattributes", "review diff"),
        (lambda r: (r / ".gitmodules").write_text('[submodule "x"]\n'), ".gitmodules", "configuration"),
    ],
)
def test_planted_files_are_violations_named_by_path(ws: Path, plant: object, path: str, reason: str) -> None:
    (ws / ".git").mkdir()
    plant(ws)  # type: ignore[operator]
    found = _reasons(ws)
    assert path in found and reason in found[path], found


@pytest.mark.parametrize(
    ("manifest", "reason"),
    [
        (HEAD + 'build = "src/gen.rs"\n', "package.build names a build script"),
        (HEAD + "[lib]\nproc-macro = true\n", "proc-macro"),
        (HEAD + '[patch.crates-io]\nserde = { path = "src" }\n', "[patch]"),
        (HEAD + '[replace]\n"foo:0.1.0" = { path = "src" }\n', "[replace]"),
        (HEAD + '[dependencies]\nevil = { git = "https://example.com/evil" }\n', "a git dependency"),
        (HEAD + "[target.'cfg(unix)'.dependencies]\nevil = { path = \"../outside\" }\n", "leaves the crate"),
        (HEAD + '[build-dependencies]\nevil = { path = "/etc" }\n', "is absolute"),
        (HEAD + '[dependencies]\nevil = { path = "target/x" }\n', "points into target/"),
        (HEAD + '[workspace]\nmembers = ["../outside/*"]\n', "workspace.members"),
        (HEAD + '[[bin]]\nname = "x"\npath = "../outside/main.rs"\n', "bin.path"),
        (HEAD + '[lib]\npath = "../outside/lib.rs"\n', "lib.path"),
        (HEAD + '[[test]]\nname = "t"\npath = "/etc/passwd"\n', "test.path"),
        (HEAD + '[[example]]\nname = "e"\npath = "src/../../outside/e.rs"\n', "example.path"),
        (HEAD + '[[bench]]\nname = "b"\npath = "target/b.rs"\n', "bench.path"),
        (HEAD + "[lib]\nproc_macro = true\n", "proc macro"),
        (HEAD + '[lib]\ncrate-type = ["proc-macro"]\n', "proc macro"),
        (HEAD + '[lib]\ncrate_type = ["rlib", "proc_macro"]\n', "proc macro"),
        (HEAD + '[dependencies]\nx = { version = "1", registry-index = "file:///elsewhere" }\n', "registry-index"),
        (HEAD + "[[[", "not valid TOML"),
    ],
)
def test_manifest_rules(ws: Path, manifest: str, reason: str) -> None:
    (ws / "Cargo.toml").write_text(manifest)
    found = _reasons(ws)
    assert "Cargo.toml" in found and reason in found["Cargo.toml"], found


def test_a_build_script_outside_the_crate_is_refused_even_where_build_scripts_are_allowed(ws: Path) -> None:
    (ws / "Cargo.toml").write_text(HEAD + 'build = "../outside/build.rs"\n')
    found = _reasons(ws, allow_build_scripts=True)
    assert (
        "Cargo.toml" in found and "package.build" in found["Cargo.toml"] and "leaves the crate" in found["Cargo.toml"]
    )


def test_a_proc_macro_member_is_refused_however_it_is_declared(ws: Path) -> None:
    (ws / "Cargo.toml").write_text(HEAD + '[workspace]\nmembers = ["macros"]\n')
    (ws / "macros" / "src").mkdir(parents=True)
    (ws / "macros" / "src" / "lib.rs").write_text("")
    (ws / "macros" / "Cargo.toml").write_text(HEAD.replace('"x"', '"macros"') + '[lib]\ncrate-type = ["proc-macro"]\n')
    found = _reasons(ws)
    assert "proc macro" in found["macros/Cargo.toml"]
    # published as a proc macro, it stays allowed while unchanged
    git = Git(ws, ProcessRunner())
    git.init("published")
    git.commit("Published source", all_files=True, force=True)
    git("tag", "published")
    assert check_tree(ws, baseline=Baseline.from_git(git)) == []


def test_members_and_path_dependencies_are_followed_and_their_build_scripts_seen(ws: Path) -> None:
    (ws / "Cargo.toml").write_text(
        HEAD + '[workspace]\nmembers = ["crates/*"]\n[dependencies]\nhelper = { path = "helper" }\n'
    )
    for member in ("crates/a", "helper"):
        (ws / member / "src").mkdir(parents=True)
        (ws / member / "src" / "lib.rs").write_text("")
    (ws / "crates" / "a" / "Cargo.toml").write_text(HEAD + '[dependencies]\nevil = { git = "https://x" }\n')
    (ws / "helper" / "Cargo.toml").write_text(HEAD.replace('"x"', '"helper"'))
    (ws / "helper" / "build.rs").write_text("fn main() {}")
    (ws / "tests" / "fixture").mkdir(parents=True)  # nothing depends on it: cargo never reads it
    (ws / "tests" / "fixture" / "Cargo.toml").write_text(HEAD + '[dependencies]\nz = { git = "https://x" }\n')
    found = _reasons(ws)
    assert "git dependency" in found["crates/a/Cargo.toml"]
    assert "build script" in found["helper/build.rs"]
    assert "tests/fixture/Cargo.toml" not in found
    assert set(_reasons(ws, allow_build_scripts=True)) == {"crates/a/Cargo.toml"}


def test_what_was_published_is_allowed_while_unchanged(ws: Path) -> None:
    (ws / "build.rs").write_text('fn main() { println!("cargo:rerun-if-changed=build.rs"); }\n')
    (ws / "rust-toolchain.toml").write_text('[toolchain]\nchannel = "stable"\n')
    (ws / "Cargo.toml").write_text(HEAD + "[lib]\nproc-macro = true\n")
    git = Git(ws, ProcessRunner())
    git.init("published")
    git.commit("Published source", all_files=True, force=True)
    git("tag", "published")
    baseline = Baseline.from_git(git)
    assert baseline.build_scripts == {"build.rs"} and baseline.proc_macros == {"Cargo.toml"}
    assert check_tree(ws, baseline=baseline) == []
    assert check_tree(ws) != []  # without the baseline, all three are refused

    (ws / "build.rs").write_text('fn main() { std::fs::write("/tmp/x", "pwned").ok(); }\n')
    found = {v.path: v.reason for v in check_tree(ws, baseline=baseline)}
    assert "changed since it was published" in found["build.rs"]
    (ws / "build.rs").unlink()
    (ws / "Cargo.toml").write_text(HEAD + 'build = "src/gen.rs"\n')
    (ws / "src" / "gen.rs").write_text("fn main() {}")
    found = {v.path: v.reason for v in check_tree(ws, baseline=baseline)}
    assert "package.build" in found["Cargo.toml"] and "new" in found["src/gen.rs"]


def test_check_manifest_checks_text_before_it_is_written(ws: Path) -> None:
    doc = {
        "package": {"name": "x", "metadata": {"tool": {"path": "/anywhere"}}},
        "dependencies": {"y": {"path": "src"}},
    }
    assert check_manifest(ws, ws / "Cargo.toml", doc) == []  # metadata is not cargo's; a path inside is fine
    nested = ws / "crates" / "a" / "Cargo.toml"
    ok = {"package": {"name": "a"}, "dependencies": {"x": {"path": "../.."}}}
    assert check_manifest(ws, nested, ok) == []  # '..' that stays inside
    [violation] = check_manifest(ws, nested, {"dependencies": {"x": {"path": "../../.."}}})
    assert violation.path == "crates/a/Cargo.toml" and "leaves the crate" in violation.reason


def test_enforce_raises_a_policy_error_naming_every_file(ws: Path) -> None:
    (ws / "build.rs").write_text("fn main() {}")
    (ws / ".cargo").mkdir()
    with pytest.raises(PolicyError) as caught:
        enforce(ws)
    message = str(caught.value)
    assert re.search(r"- build\.rs: a build script.*--allow-build-scripts", message)
    assert "- .cargo: a .cargo/ directory" in message and str(ws) in message
    assert all(isinstance(v, Violation) for v in caught.value.violations) and len(caught.value.violations) == 2
    with pytest.raises(PolicyError):  # .cargo/ stays refused when build scripts are allowed
        enforce(ws, allow_build_scripts=True)


@pytest.mark.parametrize("name", ["target", ".flakebot-candidates"])
def test_a_symlink_or_file_where_flakebot_keeps_build_output_is_a_violation(ws: Path, name: str) -> None:
    # not walked (build output, not source), but flakebot's own paths go through them
    (ws / name).symlink_to(ws.parent / "outside")
    assert "not a directory (a symlink?)" in _reasons(ws)[name]
    (ws / name).unlink()
    (ws / name).write_text("")
    assert "not a directory" in _reasons(ws)[name]
    (ws / name).unlink()
    (ws / name / "x").mkdir(parents=True)
    (ws / name / "x" / "link").symlink_to("/root")  # inside it: output, not looked at
    assert name not in _reasons(ws)
