"""Workspace paths as an invariant: what sandboxed code plants in a workspace never redirects flakebot.

Crate code and model-written code run with the workspace writable, so every
path in it may have become a symlink, or a hard link, by the time flakebot
uses it. Three properties, each over every door (the red team's A01 A02 A07
A14 A15 A19 A20 are instances):

1. every path flakebot binds, writes, copies or reads in a workspace is
   resolved without following a symlink the sandbox could have planted: the
   target dirs and their parents (``target``, ``target/flakebot-test``,
   ``target/flakebot-tmp``, ``.flakebot-candidates``), ``flake.nix``, a
   committed directory the export copies, the eval's ``tests/``; and no file
   of one candidate shares an inode with another tree;
2. what is deployed or exported is exactly the proven commit's bytes: the
   binary a test tried to replace, sources a test rewrote after the commit;
3. the tree policy runs before every toolchain command, whatever the registry
   (a directory registry has nothing to download, yet its doors are gated).

The crates' own tests do the planting, in the sandbox, through the real
pipeline (real cargo, real bubblewrap; the model is the fake OpenAI server, a
test double), pointing their links at a directory outside the workspace that
no sandbox shows: anything written there came through flakebot.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest
from editscripts import call, reply
from tinycrates import crate, write_registry

from flakebot_magic.config import Settings
from flakebot_magic.edit.checkrun import LOOP_TARGET, CheckRunner
from flakebot_magic.edit.files import WorkspaceFiles
from flakebot_magic.edit.forks import clone_candidate
from flakebot_magic.errors import EditError, PolicyError
from flakebot_magic.events import EventBus
from flakebot_magic.host.git import Git
from flakebot_magic.host.process import ProcessRunner
from flakebot_magic.manage.export import export_replit
from flakebot_magic.manage.workspace_cargo import run_cargo
from flakebot_magic.pipeline import Pipeline
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.request import BuildRequest
from flakebot_magic.sandbox import Sandbox
from flakebot_magic.sandbox.cargo import Cargo
from flakebot_magic.sandbox.policy import Baseline, TreePolicy
from flakebot_magic.stages.build import check
from flakebot_magic.stages.fork import fork
from flakebot_magic.testing.fake_openai import FakeOpenAIServer

pytestmark = pytest.mark.cargo

VICTIM = "# the user's own file\n"


def _outside(tmp_path: Path) -> Path:
    """A directory outside every workspace and every sandbox: a victim file and empty directories to aim at."""
    out = tmp_path / "outside"
    for name in ("bound", "cands", "tmp", "secret"):
        (out / name).mkdir(parents=True)
    (out / "victim.txt").write_text(VICTIM)
    (out / "secret" / "data.txt").write_text("SECRET-OUTSIDE\n")
    return out


def _untouched(out: Path) -> None:
    assert (out / "victim.txt").read_text() == VICTIM
    assert (out / "secret" / "data.txt").read_text() == "SECRET-OUTSIDE\n"
    for name in ("bound", "cands", "tmp"):
        assert list((out / name).iterdir()) == [], f"{out / name} was written from a workspace"


#: the build stage's test: plants a symlink at every path flakebot uses after it, tries to swap the release
#: binary and rewrites the committed source (after waiting out the release build, were it concurrent)
PLANTER = r"""
fn main() { println!("honest"); }

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;
    const OUT: &str = "@OUT@";

    #[test]
    fn plant() {
        let ws = env!("CARGO_MANIFEST_DIR");
        let at = |p: &str| format!("{}/{}", ws, p);
        let _ = std::fs::write(format!("{}/bound/escaped", OUT), "written from a sandbox");
        let _ = std::fs::remove_file(at("flake.nix"));
        symlink(format!("{}/victim.txt", OUT), at("flake.nix")).unwrap();
        std::fs::remove_dir_all(at("x")).unwrap();
        symlink(format!("{}/secret", OUT), at("x")).unwrap();
        let _ = std::fs::remove_dir_all(at(".flakebot-candidates"));
        symlink(format!("{}/cands", OUT), at(".flakebot-candidates")).unwrap();
        let _ = std::fs::remove_dir_all(at("target/flakebot-tmp"));
        let _ = symlink(format!("{}/tmp", OUT), at("target/flakebot-tmp"));
        std::thread::sleep(std::time::Duration::from_secs(2));
        for bin in [at("target/release/planter"), at("../.sandbox/planter/release-target/release/planter")] {
            let _ = std::fs::remove_file(&bin);
            let _ = std::fs::write(&bin, "#!/bin/sh\necho SWAPPED\n");
        }
        std::fs::write(at("src/main.rs"), "fn main() { println!(\"NOT-IN-ANY-COMMIT\"); }\n").unwrap();
    }
}
"""


def test_the_build_stage_deploy_and_export_follow_no_planted_link(tmp_path: Path) -> None:
    out = _outside(tmp_path)
    registry = write_registry(
        tmp_path / "reg",
        [
            crate(
                "planter",
                files={"src/main.rs": PLANTER.replace("@OUT@", str(out)), "x/data.txt": "committed data\n"},
            )
        ],
    )
    settings = Settings(cache_dir=tmp_path / "cache", registry=str(registry), backend="cargo", model=None)
    tool = Pipeline(settings).run(BuildRequest("print honest", crate="planter", name="planter"))
    _untouched(out)  # flake.nix written through its link (A01), a target dir bound outside (A20)
    # the deployed binary is the commit's build, not the test's swap (A07) nor the rewritten source
    binary = settings.cache.store.glob("*-planter-0.1.0/bin/planter")
    assert subprocess.run([str(next(binary))], capture_output=True, text=True).stdout == "honest\n"
    workspace = settings.cache.workspaces / "planter"
    git = Git(workspace, ProcessRunner())
    assert (workspace / "flake.nix").is_file() and not (workspace / "flake.nix").is_symlink()
    assert tool.source_hash  # the tool is there
    # the export is the commit's bytes, file for file (A02): not the symlinked x/, not the rewritten main.rs
    exported = export_replit(settings, "planter", tmp_path / "repl").source
    committed = [f for f in git("ls-tree", "-r", "-z", "--name-only", "HEAD").split("\0") if f]
    assert sorted(str(p.relative_to(exported)) for p in exported.rglob("*") if p.is_file()) == sorted(committed)
    for name in committed:
        shown = subprocess.run(["git", "-C", str(workspace), "show", f"HEAD:{name}"], capture_output=True).stdout
        assert (exported / name).read_bytes() == shown, name
    assert (exported / "x" / "data.txt").read_text() == "committed data\n"


#: the edit loop's check runs (A20): run 0 plants target -> .flakebot-candidates/x and x/flakebot-test -> OUT;
#: every later run tries to write there
CHAIN = r"""
fn main() { println!("x"); }

#[cfg(test)]
mod tests {
    #[test]
    fn plant_then_use() {
        let ws = env!("CARGO_MANIFEST_DIR");
        let _ = std::fs::write("@OUT@/bound/escaped", "written from a sandbox");
        let cands = format!("{}/.flakebot-candidates", ws);
        let _ = std::fs::create_dir_all(format!("{}/x", cands));
        let _ = std::os::unix::fs::symlink("@OUT@/bound", format!("{}/x/flakebot-test", cands));
        let target = format!("{}/target", ws);
        if std::fs::rename(&target, format!("{}/old-target", cands)).is_ok() {
            let _ = std::os::unix::fs::symlink(".flakebot-candidates/x", &target);
        }
    }
}
"""


def test_the_edit_loop_never_binds_a_target_dir_a_test_planted(tmp_path: Path) -> None:
    out = _outside(tmp_path)
    main = CHAIN.replace("@OUT@", str(out))
    registry = write_registry(tmp_path / "reg", [crate("chain", files={"src/main.rs": main})])
    script = {
        "responses": [
            reply(call("run_checks")),
            reply(call("run_checks")),
            reply(call("finish", summary="prints x")),
            reply(call("finish", summary="prints x")),
        ]
    }
    with FakeOpenAIServer(script) as model:
        settings = Settings(
            cache_dir=tmp_path / "cache",
            registry=str(registry),
            backend="cargo",
            model="scripted-test-double",
            base_url=model.base_url,
            max_iterations=4,
        )
        with pytest.raises(EditError, match="check runs 1 and 2"):  # no contract: stuck, after the runs that matter
            Pipeline(settings).run(BuildRequest("print x", crate="chain", name="chain"))
    _untouched(out)


TINYDEP = crate("tinydep", files={"src/lib.rs": "pub fn one() -> u32 { 1 }\n"})
POISON = r"""
#[test]
fn poison() {
    // at run time: the test binary compiled in the workspace is fresh, and reused, in the clone
    let ws = std::env::var("CARGO_MANIFEST_DIR").unwrap();
    if !ws.contains(".flakebot-candidates") { return; }
    for e in std::fs::read_dir(format!("{}/target/flakebot-test/debug/deps", ws)).unwrap() {
        let p = e.unwrap().path();
        if p.extension().map(|x| x == "rlib" || x == "rmeta").unwrap_or(false) {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
            f.write_all(b"POISONED-BY-A-CANDIDATE").unwrap();
        }
    }
}
"""


def _digests(root: Path) -> dict[str, tuple[int, str]]:
    deps = root.joinpath(*LOOP_TARGET, "debug", "deps")
    return {p.name: (p.stat().st_ino, hashlib.sha256(p.read_bytes()).hexdigest()) for p in deps.iterdir()}


def test_a_candidate_writes_no_file_of_the_workspace_or_another_candidate(tmp_path: Path) -> None:
    racer = crate(
        "racer",
        manifest='[package]\nname = "racer"\nversion = "0.1.0"\nedition = "2021"\n\n[dependencies]\ntinydep = "0.1"\n',
        files={"src/lib.rs": "pub fn two() -> u32 { tinydep::one() + 1 }\n", "tests/poison.rs": POISON},
    )
    registry = DirectoryRegistry(write_registry(tmp_path / "reg", [TINYDEP, racer]), tmp_path / "index")
    runner = ProcessRunner()
    cargo = Cargo(registry, runner)
    ws = fork(registry.get("racer"), registry, tmp_path / "ws", "racer", runner=runner, bus=EventBus([]), cargo=cargo)

    def checks(root: Path) -> CheckRunner:
        git = Git(root, runner)
        return CheckRunner(
            WorkspaceFiles(root, published=Baseline.from_git(git)),
            cargo=cargo.confined_to(Sandbox(root)),
            git=git,
            bus=EventBus([]),
            build_timeout=300,
            test_timeout=300,
        )

    assert checks(ws.path).cargo_run(0, clippy=False).tests.passed == 1
    before = _digests(ws.path)
    candidate = clone_candidate(ws.path, 0, runner=runner)
    run = checks(candidate).cargo_run(1, clippy=False)
    assert run.tests.passed == 1, run.note  # the poisoning test ran in the candidate
    theirs = _digests(candidate)
    assert _digests(ws.path) == before  # not one byte of the workspace's dependency libraries changed
    shared = {ino for ino, _ in before.values()} & {ino for ino, _ in theirs.values()}
    assert shared == set()
    assert any(h != before[name][1] for name, (_, h) in theirs.items() if name in before)  # the test did write


def test_the_policy_gates_every_cargo_door_for_a_registry_on_disk(tmp_path: Path) -> None:
    registry_dir = write_registry(tmp_path / "reg", [crate("gated", files={"src/main.rs": "fn main() {}\n"})])
    registry = DirectoryRegistry(registry_dir, tmp_path / "index")
    assert registry.offline
    runner = ProcessRunner()
    cargo = Cargo(registry, runner)
    settings = Settings(cache_dir=tmp_path / "cache", registry=str(registry_dir), backend="cargo", model=None)
    ws = fork(
        registry.get("gated"),
        registry,
        settings.cache.workspaces,
        "gated",
        runner=runner,
        bus=EventBus([]),
        cargo=cargo,
    )
    marker = ws.path / "PLANTED-BUILD-SCRIPT-RAN"
    # what a test leaves after the build stage's last policy check: a build script nobody allowed
    (ws.path / "build.rs").write_text(f'fn main() {{ std::fs::write("{marker}", "x").unwrap(); }}\n')
    policy = TreePolicy(False, Baseline.from_git(Git(ws.path, runner)))
    with pytest.raises(PolicyError, match=r"build\.rs"):
        check(ws.path, cargo, EventBus([]), policy=policy, build_timeout=300, test_timeout=300)
    git = Git(ws.path, runner)
    checks = CheckRunner(
        WorkspaceFiles(ws.path, published=Baseline.from_git(git)),
        cargo=cargo.confined_to(Sandbox(ws.path)),
        git=git,
        bus=EventBus([]),
        build_timeout=300,
        test_timeout=300,
    )
    run = checks.cargo_run(0, clippy=False)
    assert run.refused_before and not run.built
    with pytest.raises(PolicyError, match=r"build\.rs"):
        run_cargo(settings, "gated", ["build"])
    assert not marker.exists()
