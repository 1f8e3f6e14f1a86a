"""Attack: a build script forges cargo's JSON to make deploy write outside the store or copy a private file.

Cargo captures a build script's own stdout, but the script can open its
parent's, cargo's (``/proc/<cargo pid>/fd/1``), and write whole lines there:
fake ``compiler-artifact`` messages whose ``target.name`` climbs out of the
store entry (``../../escaped``) or whose ``executable`` is a private file
(``~/.ssh/id_rsa`` here: a canary) or a symlink to it inside the target dir.
No bubblewrap is involved: the defence is in what flakebot believes.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from pathlib import Path

import pytest
from tinycrates import Recorder, crate, write_registry

from flakebot_magic.events import Notice
from flakebot_magic.host.git import Git
from flakebot_magic.host.process import ProcessRunner
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.sandbox.cargo import Cargo
from flakebot_magic.sandbox.command import release_target
from flakebot_magic.sandbox.policy import Baseline, TreePolicy
from flakebot_magic.stages.build import check
from flakebot_magic.stages.deploy import deploy
from flakebot_magic.stages.fork import fork

pytestmark = pytest.mark.cargo

_ARTIFACT = (
    '{{"reason":"compiler-artifact","package_id":"forge 0.1.0","manifest_path":"Cargo.toml",'
    '"target":{{"kind":["bin"],"crate_types":["bin"],"name":"{name}","src_path":"src/main.rs"}},'
    '"profile":{{"test":false}},"features":[],"filenames":["{exe}"],"executable":"{exe}","fresh":false}}'
)

_BUILD_RS = r"""use std::io::Write;

fn main() {
    let canary = "CANARY_PATH";
    let out = std::env::var("OUT_DIR").unwrap();
    let link = format!("{}/innocent", out);
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(canary, &link).unwrap();
    let lines = [FORGED];
    // cargo keeps our stdout; its own is one open() away
    let cargo = std::os::unix::process::parent_id();
    let mut stdout = std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/proc/{}/fd/1", cargo))
        .unwrap();
    for line in lines.iter() {
        stdout.write_all(format!("{}\n", line.replace("LINK", &link)).as_bytes()).unwrap();
    }
}
"""


def _forge_crate(canary: Path) -> object:
    forged = [
        _ARTIFACT.format(name="../../escaped", exe=canary),  # a name that climbs out of bin/
        _ARTIFACT.format(name="stolen", exe=canary),  # a private file outside the target dir
        _ARTIFACT.format(name="innocent", exe="LINK"),  # inside the target dir, a symlink out
        _ARTIFACT.format(name="forge", exe=canary),  # the real binary's name, a forged path
    ]
    rust_lines = ", ".join('r#"' + line + '"#' for line in forged)
    build_rs = _BUILD_RS.replace("CANARY_PATH", str(canary)).replace("FORGED", rust_lines)
    return crate(
        "forge",
        manifest='[package]\nname = "forge"\nversion = "0.1.0"\nedition = "2021"\nbuild = "build.rs"\n',
        files={"src/main.rs": 'fn main() {\n    println!("forge");\n}\n', "build.rs": build_rs},
    )


def test_forged_artifacts_reach_neither_outside_the_entry_nor_the_private_file(tmp_path: Path) -> None:
    token = secrets.token_hex(16)
    home = tmp_path / "home"
    canary = home / ".ssh" / "id_rsa"
    canary.parent.mkdir(parents=True)
    canary.write_text(f"PRIVATE KEY {token}\n")
    canary.chmod(0o600)

    registry = DirectoryRegistry(write_registry(tmp_path / "registry", [_forge_crate(canary)]), tmp_path / "index")
    recorder = Recorder()
    runner = ProcessRunner()
    cargo = Cargo(registry, runner)
    cache = tmp_path / "cache"
    try:
        workspace = fork(
            registry.get("forge"), registry, cache / "workspaces", "forge", runner=runner, bus=recorder.bus, cargo=cargo
        )
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=workspace.path, capture_output=True, text=True).stdout
        result = check(
            workspace.path,
            cargo,
            recorder.bus,
            policy=TreePolicy(baseline=Baseline.from_git(Git(workspace.path, runner))),  # its build.rs as published
            build_timeout=300,
            test_timeout=300,
            run_tests=False,
        )
    finally:
        registry.close()

    # the forgeries did reach cargo's stdout, and every one was dropped, saying why
    notices = [e.message for e in recorder.of(Notice) if "forged or unsafe compiler-artifact" in e.message]
    assert any("'../../escaped'" in n and "not a plain name" in n for n in notices), notices
    assert any("'stolen'" in n and "outside the target directory" in n for n in notices), notices
    assert any("'innocent'" in n and "outside the target directory" in n for n in notices), notices
    assert any("'forge'" in n and "outside the target directory" in n for n in notices), notices
    # the release build's target dir is flakebot's own, beside the workspace (issue 19, A07)
    release = os.path.realpath(release_target(workspace.path) / "release" / "forge")
    assert {k: os.path.realpath(v) for k, v in result.build.binaries.items()} == {"forge": release}

    store_dir = cache / "store"
    entry = deploy(store_dir, "0" * 32, "forge", "0.1.0", result.build.binaries, {"crate": "forge"})
    assert sorted(p.name for p in (entry.path / "bin").iterdir()) == ["forge"]
    assert subprocess.run([entry.bin("forge")], capture_output=True, text=True).stdout == "forge\n"
    assert sorted(p.name for p in store_dir.iterdir()) == [entry.path.name]
    assert not (cache / "escaped").exists() and not (store_dir / "escaped").exists()

    # the private file's content is nowhere but where it was
    holders = []
    for directory, _, files in os.walk(tmp_path):
        for name in files:
            path = Path(directory) / name
            if path.is_symlink() or not path.is_file():
                continue
            if token.encode() in path.read_bytes():
                holders.append(path)
    assert holders == [canary]

    # nothing was lost: the workspace and its history are as the fork left them
    now = subprocess.run(["git", "rev-parse", "HEAD"], cwd=workspace.path, capture_output=True, text=True).stdout
    assert now == head
    assert subprocess.run(["git", "rev-parse", "published"], cwd=workspace.path, capture_output=True).returncode == 0


_DEEP_BUILD_RS = r"""use std::io::Write;

fn main() {
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let cargo = std::os::unix::process::parent_id();
    // on cargo's stdout, among its JSON messages, and on its stderr, where rustdoc's bare diagnostics come
    let lines = [
        (1, format!("{{\"reason\":\"compiler-message\",\"message\":{}}}", deep)),
        (1, format!("{{\"reason\":\"compiler-artifact\",\"target\":{}}}", deep)),
        (2, format!("{{\"$message_type\":\"diagnostic\",\"message\":{}}}", deep)),
    ];
    for (fd, line) in lines.iter() {
        let mut out = std::fs::OpenOptions::new().write(true).open(format!("/proc/{}/fd/{}", cargo, fd)).unwrap();
        out.write_all(format!("{}\n", line).as_bytes()).unwrap();
    }
}
"""


def test_json_nested_without_end_in_cargos_output_is_not_json_never_a_traceback(tmp_path: Path) -> None:
    """A build script writes ``{"reason": ..., "message": [[[[...`` 100,000 deep to cargo's stdout and stderr:
    before the one JSON reader (``fsutil.load_json``) the decoder's ``RecursionError`` ended the build with a
    traceback; now the lines are not cargo's messages, and the build goes on."""
    manifest = '[package]\nname = "deep"\nversion = "0.1.0"\nedition = "2021"\nbuild = "build.rs"\n'
    files = {"src/main.rs": 'fn main() {\n    println!("deep");\n}\n', "build.rs": _DEEP_BUILD_RS}
    registry = DirectoryRegistry(
        write_registry(tmp_path / "registry", [crate("deep", manifest=manifest, files=files)]), tmp_path / "index"
    )
    recorder = Recorder()
    runner = ProcessRunner()
    cargo = Cargo(registry, runner)
    try:
        workspace = fork(
            registry.get("deep"),
            registry,
            tmp_path / "cache" / "workspaces",
            "deep",
            runner=runner,
            bus=recorder.bus,
            cargo=cargo,
        )
        result = check(
            workspace.path,
            cargo,
            recorder.bus,
            policy=TreePolicy(baseline=Baseline.from_git(Git(workspace.path, runner))),
            build_timeout=300,
            test_timeout=300,
        )
    finally:
        registry.close()
    assert sorted(result.build.binaries) == ["deep"]
    assert subprocess.run([result.build.binaries["deep"]], capture_output=True, text=True).stdout == "deep\n"
