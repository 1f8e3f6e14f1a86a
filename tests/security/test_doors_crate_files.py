"""Row "crate files" of the matrix (docs/SECURITY.md): what a crate's code leaves in its workspace never breaks
the host: no walk, count, copy or removal of flakebot's recurses, follows a link or misses what lies deep.

Sandboxed code (a crate's test, here) can leave a tree as deep as it likes. Before issue 33 one 1,500 levels
deep raised ``RecursionError`` in the edit loop's walk and made ``clean --all`` crash, so the workspace could not
be removed; and the sandbox's disk and file limits, which count what a command may write, passed over whatever
lay below ``PATH_MAX``. Here a crate's test plants a tree 10,000 levels deep (and a file at its bottom) at every
door: the build stage and deploy, the edit loop's policy and revert, the disk watch's count, ``clean --all``.
(The deployed binary, this row's last cell, is ``test_proven_commit.py``'s.)

Real cargo in the sandbox; the model is the scripted fake server (a test double, not a model).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from door_payloads import deep_trees_removed  # noqa: F401  (an autouse fixture)
from editscripts import call, reply
from scripted_builds import scripted_settings
from tinycrates import crate, write_registry

from flakebot_magic.cli import main as cli_main
from flakebot_magic.config import Settings
from flakebot_magic.errors import FlakebotError
from flakebot_magic.pipeline import Pipeline
from flakebot_magic.request import BuildRequest
from flakebot_magic.sandbox import Sandbox
from flakebot_magic.testing.fake_openai import FakeOpenAIServer

pytestmark = pytest.mark.cargo

DEPTH = 10_000
#: a CLI whose test digs: ``deep/a/a/...`` and ``target/deep/a/...``, DEPTH levels each, a file at the bottom
DIGGER = r"""
fn main() {
    if std::env::args().any(|a| a == "--help") {
        println!("Usage: digger\nPrints a greeting.");
        return;
    }
    println!("dug");
}

#[cfg(test)]
mod tests {
    fn dig(top: &str) {
        let start = std::env::current_dir().unwrap();
        let _ = std::fs::create_dir_all(top);
        std::env::set_current_dir(top).unwrap();
        for _ in 0..@DEPTH@ {
            let _ = std::fs::create_dir("a");
            std::env::set_current_dir("a").unwrap();
        }
        std::fs::write("bottom", vec![b'x'; 1 << 20]).unwrap();
        std::env::set_current_dir(start).unwrap();
    }

    #[test]
    fn digs() {
        std::env::set_current_dir(env!("CARGO_MANIFEST_DIR")).unwrap();
        dig("deep");
        dig("target/deep");
    }
}
""".replace("@DEPTH@", str(DEPTH))
CONTRACT = '\n[package.metadata.flakebot]\nkind = "cli"\nbin = "digger"\n'


def _registry(tmp_path: Path) -> Path:
    manifest = '[package]\nname = "digger"\nversion = "0.1.0"\nedition = "2021"\nlicense = "MIT"\n' + CONTRACT
    return write_registry(tmp_path / "reg", [crate("digger", manifest=manifest, files={"src/main.rs": DIGGER})])


def _depth(top: Path) -> int:
    """How deep ``top/a/a/...`` goes (by descriptors: the path is longer than the kernel takes)."""
    fd, depth = os.open(top, os.O_RDONLY | os.O_DIRECTORY), 0
    try:
        while True:
            try:
                inner = os.open("a", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                return depth
            os.close(fd)
            fd, depth = inner, depth + 1
    finally:
        os.close(fd)


def test_a_deep_tree_from_the_build_stages_tests_is_counted_deployed_past_and_cleaned(tmp_path: Path) -> None:
    registry = _registry(tmp_path)
    settings = Settings(cache_dir=tmp_path / "cache", registry=str(registry), backend="cargo", model=None)
    # the manifest counts target/'s bytes (a walk) and the run drops target/ after deploying (a removal)
    tool = Pipeline(settings).run(BuildRequest("", crate="digger", name="digger"))
    assert tool(input="") == "dug\n"
    workspace = settings.cache.workspaces / "digger"
    assert _depth(workspace / "deep") == DEPTH  # the test did dig, in the sandbox
    assert not (workspace / "target").exists()  # dropped, however deep
    # the disk watch's count reaches the bottom (a path-based walk stopped at PATH_MAX and missed its MiB)
    used = Sandbox(workspace).disk_usage()
    assert used.files >= DEPTH + 1 and used.bytes >= 1 << 20, used
    # clean --all removes the workspace, however deep, and says so
    assert cli_main(["clean", "--all", "--cache-dir", str(settings.cache_dir)]) == 0
    assert not workspace.exists()


def test_a_deep_tree_in_the_edit_loop_is_refused_reverted_and_said(tmp_path: Path) -> None:
    registry = _registry(tmp_path)
    script = {"responses": [reply(call("finish", summary="done"))] * 6}
    with FakeOpenAIServer(script) as server:
        settings = scripted_settings(tmp_path / "cache", registry, server, max_iterations=3)
        try:
            Pipeline(settings).run(BuildRequest("print dug", crate="digger", name="digger"))
        except FlakebotError as exc:  # a clear error (the tree is refused every run), never a RecursionError
            said = str(exc)
        else:
            said = ""
    notes = "\n".join(p.read_text(errors="replace") for p in (settings.cache_dir / "logs").glob("*.log"))
    assert "nested deeper than" in notes + said, (said, notes[-2000:])
    assert "RecursionError" not in notes + said
    assert cli_main(["clean", "--all", "--cache-dir", str(settings.cache_dir)]) == 0
    assert not any(settings.cache.workspaces.glob("digger*"))
