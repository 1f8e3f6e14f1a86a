"""The trust boundary as an invariant: no Rust toolchain process ever runs outside the sandbox, through any door.

Not one attack but the property every attack on the toolchain needs to break:
cargo, rustc, rustdoc, rustup and clippy run what a crate ships or says
(build scripts, proc macros, ``.cargo/config.toml``, ``rust-toolchain.toml``),
so each of them must run inside the sandbox, whatever flakebot is doing.

How it is watched (TEST WRAPPERS, written by this module, not flakebot's):

* a recording toolchain: ``$HOME/.cargo/bin`` holds wrappers for rustup's
  proxies (cargo, rustc, rustdoc, rustup, cargo-clippy, clippy-driver), first
  on ``PATH``; they run a copy of the real rustup with ``RUSTUP_HOME`` set to a
  copy of the real toolchain (hard links) whose ``bin/`` programs are wrappers
  too. Wherever flakebot looks for the toolchain (``PATH``, ``~/.cargo/bin``,
  the sysroot ``rustc --print sysroot`` names), it finds a wrapper;
* each wrapper compares its namespaces (``/proc/self/ns/pid`` and ``mnt``) with
  this test's: the same means outside any sandbox, and the call is appended to
  a log in the test's directory (which no sandbox shows). Inside our sandbox
  the cargo wrapper says so on stderr, which flakebot relays as a log line:
  evidence that the wrappers were the toolchain in use;
* a ``git`` wrapper records every git call flakebot makes (all outside, by
  design) and whether git could read configuration a crate wrote there: a
  ``.git`` that is not a directory, ``.git/config`` keys beyond what ``git
  init`` writes, or a ``.gitattributes`` in the tree that nothing neutralises;
* the crate's own code (its build script, its tests, its binary) appends to
  the same log: it can only reach that file from outside every sandbox, ours
  and nix's.

Then the pipeline goes through every door that reaches crate code: a fork from
a directory registry and from the fake crates.io (a real download in the fetch
profile), the release build and the tests, clippy, the edit loop with a scripted
model (the fake OpenAI server, a test double), two candidates, acceptance
examples, the ``--help`` probe, ``--continue``, a session killed and resumed,
``flakebot cargo``, and the nix backend (whose builder runs in nix's sandbox:
the crate's build script there reports namespaces other than the host's).
Each test fails on any toolchain process outside the sandbox.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from editscripts import TINYHEX_CONTRACT, call, reply
from scripted_builds import kill_when
from tinycrates import Crate, Recorder, crate, write_registry

from flakebot_magic.config import Settings
from flakebot_magic.events import LogLine
from flakebot_magic.pipeline import Pipeline
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.request import BuildRequest, PersonText, RunFlags
from flakebot_magic.sandbox import bubblewrap_works
from flakebot_magic.testing.fake_openai import FakeOpenAIServer

pytestmark = [
    pytest.mark.cargo,
    pytest.mark.skipif(bool(bubblewrap_works()), reason=f"no working bubblewrap: {bubblewrap_works()}"),
]

REPO = Path(__file__).resolve().parents[2]
STAND_IN = REPO / "tests" / "nixpkgs"
#: what the toolchain wrappers stand in for (rustup's proxies and the toolchain's own programs)
TOOLCHAIN = ("cargo", "rustc", "rustdoc", "rustup", "cargo-clippy", "clippy-driver")
REQUEST = "hex-encode standard input"
EXAMPLES = '\n>>> hexer(b"hi")\n6869\n'


def _host_namespaces() -> str:
    return " ".join(os.readlink(f"/proc/self/ns/{ns}") for ns in ("pid", "mnt"))


# -- the recording toolchain ------------------------------------------------------------------

_WRAPPER = """#!/bin/bash
# TEST WRAPPER (tests/security/test_trust_boundary.py): records where it runs, then runs the real program.
ns="$(readlink /proc/self/ns/pid) $(readlink /proc/self/ns/mnt)"
if [ "$ns" = "{host}" ]; then
    args="$*"; printf '%s\\toutside\\t%s\\t%s\\n' "{name}" "$PWD" "${{args//$'\\n'/ }}" >> "{log}"
elif [ "{name}" = cargo ]; then
    echo "TEST-WRAPPER cargo inside the sandbox" >&2
fi
{run}
"""

# the git wrapper: where git could read configuration a crate (or sandboxed code) wrote
_GIT_CHECKS = r"""
repo="$PWD"; prev=""
for arg in "$@"; do [ "$prev" = "-C" ] && repo="$arg"; prev="$arg"; done
gitdir="${GIT_DIR:-$repo/.git}"
problems=""
if [ -L "$repo/.git" ] || [ -f "$repo/.git" ]; then problems="$problems gitdir-file"; fi
if [ -f "$gitdir/config" ] && grep -qvE \
    '^\s*(\[(core|extensions)\]|(repositoryformatversion|filemode|bare|logallrefupdates|ignorecase|precomposeunicode|symlinks|objectformat|refstorage)\s*=.*|[#;].*)?\s*$' \
    "$gitdir/config"; then problems="$problems planted-config"; fi
if [ -d "$repo/.git" ] && ! grep -qs '!diff' "$gitdir/info/attributes" && \
    [ -n "$(find "$repo" -path "$repo/.git" -prune -o -path "$repo/target" -prune -o \
        -path "$repo/.flakebot-candidates" -prune -o -name .gitattributes -print -quit 2>/dev/null)" ]; then
    problems="$problems attributes"
fi
args="$*"; args="${args//$'\n'/ }"; args="${args//$'\t'/ }"  # commit messages: one line in the log
printf 'git\toutside\t%s\t%s\t%s\n' "$repo" "$args" "$problems" >> "{log}"
exec "{real}" "$@"
"""


@dataclass
class Harness:
    """The recording toolchain, its log, and the environment that puts it first."""

    root: Path
    log: Path
    env: dict[str, str]
    host: str

    def records(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [line.split("\t") for line in self.log.read_text().splitlines() if line]

    def outside(self) -> list[list[str]]:
        """Toolchain programs and crate code that ran outside the sandbox."""
        return [r for r in self.records() if r[0] != "git"]

    def git(self) -> list[list[str]]:
        return [r for r in self.records() if r[0] == "git"]

    def clear(self) -> None:
        self.log.unlink(missing_ok=True)


def _write(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Harness:
    root = tmp_path_factory.mktemp("recording-toolchain")
    log = root / "outside.log"
    host = _host_namespaces()
    home = root / "home"
    proxies = home / ".cargo" / "bin"
    proxies.mkdir(parents=True)
    rustup = shutil.which("rustup")
    env = {"HOME": str(home)}
    if rustup is not None:
        # rustup's proxies, and a copy of the active toolchain (hard links) whose programs are wrappers
        real_home = Path(os.environ.get("RUSTUP_HOME") or Path.home() / ".rustup")
        name = subprocess.run(
            [rustup, "show", "active-toolchain"], cwd="/", capture_output=True, text=True, check=True
        ).stdout.split()[0]
        fake_home = root / "rustup"
        for directory in ("toolchains", "update-hashes", "downloads", "tmp"):  # what rustup's proxies expect
            (fake_home / directory).mkdir(parents=True)
        (fake_home / "settings.toml").write_text(f'version = "12"\ndefault_toolchain = "{name}"\nprofile = "default"\n')
        toolchain = fake_home / "toolchains" / name
        subprocess.run(["cp", "-al", str(real_home / "toolchains" / name), str(toolchain)], check=True)
        try:
            os.link(os.path.realpath(rustup), proxies / ".rustup-real")
        except OSError:  # another file system
            shutil.copy2(os.path.realpath(rustup), proxies / ".rustup-real")
        for program in TOOLCHAIN:
            binary = toolchain / "bin" / program
            if binary.exists():
                binary.rename(toolchain / "bin" / f".{program}-real")
                run = f'exec -a "{program}" "{toolchain}/bin/.{program}-real" "$@"'
                _write(binary, _WRAPPER.format(host=host, name=program, log=log, run=run))
            run = f'exec -a "{program}" "{proxies}/.rustup-real" "$@"'
            _write(proxies / program, _WRAPPER.format(host=host, name=program, log=log, run=run))
        env["RUSTUP_HOME"] = str(fake_home)
    else:  # a plain install (Debian's cargo): the wrappers run its programs, which the sandbox shows in /usr
        for program in TOOLCHAIN:
            real = shutil.which(program)
            if real is not None:
                run = f'exec -a "{program}" "{real}" "$@"'
                _write(proxies / program, _WRAPPER.format(host=host, name=program, log=log, run=run))
    wrappers = root / "bin"
    wrappers.mkdir()
    git = shutil.which("git")
    assert git is not None
    _write(wrappers / "git", "#!/bin/bash\n" + _GIT_CHECKS.replace("{log}", str(log)).replace("{real}", git))
    env["PATH"] = os.pathsep.join([str(wrappers), str(proxies), "/usr/local/bin", "/usr/bin", "/bin"])
    return Harness(root=root, log=log, env=env, host=host)


@pytest.fixture
def recording(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    """The recording toolchain first, for this test (and the processes it starts)."""
    harness.clear()
    for key, value in harness.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("RUSTUP_TOOLCHAIN", raising=False)
    monkeypatch.delenv("CARGO_HOME", raising=False)
    yield harness


# -- the crate: it reports from wherever it runs ----------------------------------------------

_REPORT = """
fn report(what: &str) {
    use std::io::Write;
    let ns = |n: &str| std::fs::read_link(format!("/proc/self/ns/{}", n)).map(|p| p.display().to_string()).unwrap_or_default();
    let here = format!("{} {}", ns("pid"), ns("mnt"));
    // only a process outside every sandbox can see this file
    if let Ok(mut log) = std::fs::OpenOptions::new().append(true).create(true).open("LOG") {
        let _ = writeln!(log, "crate-code\\toutside\\t{}\\t{}", what, here);
    }
    if here == "HOST" { eprintln!("OUTSIDE THE SANDBOX: {}", what); }
}
"""


def _report(harness: Harness) -> str:
    return _REPORT.replace("LOG", str(harness.log)).replace("HOST", harness.host)


def _build_rs(harness: Harness) -> str:
    return (
        _report(harness)
        + 'fn main() {\n    report("build.rs");\n'
        + '    let ns = std::fs::read_link("/proc/self/ns/pid").map(|p| p.display().to_string()).unwrap_or_default();\n'
        + '    println!("cargo:warning=INVARIANT build.rs ran, pid namespace {}", ns);\n}\n'
    )


def _main_rs(harness: Harness) -> str:
    return (
        'use std::io::Read;\n\nconst HELP: &str = "Usage: tinyhex\nPrints its standard input as hex.";\n'
        + _report(harness)
        + textwrap.dedent(
            """
            fn to_hex(bytes: &[u8]) -> String {
                bytes.iter().map(|b| format!("{:02x}", b)).collect()
            }

            fn main() {
                report("main");
                if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
                    println!("{}", HELP);
                    return;
                }
                let mut input = Vec::new();
                std::io::stdin().read_to_end(&mut input).expect("read standard input");
                println!("{}", to_hex(&input));
            }

            #[cfg(test)]
            mod tests {
                #[test]
                fn hex() {
                    super::report("test");
                    assert_eq!(super::to_hex(b"hi"), "6869");
                }
            }
            """
        )
    )


def _tinyshout(harness: Harness) -> Crate:
    # a source of its own per run: nix builds it (and its build script runs) rather than finding it in the store
    main = _main_rs(harness).replace("tinyhex", "tinyshout") + f"// run {uuid.uuid4().hex}\n"
    return crate(
        "tinyshout",
        description="Prints standard input as hex, loudly",
        files={"src/main.rs": main, "build.rs": _build_rs(harness)},
    )


def _tinyhex(harness: Harness) -> Crate:
    lib = 'pub fn to_hex(bytes: &[u8]) -> String {\n    bytes.iter().map(|b| format!("{:02x}", b)).collect()\n}\n'
    lib += '\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn it() {\n        assert_eq!(super::to_hex(b"a"), "61");\n    }\n}\n'
    return crate(
        "tinyhex",
        description="Hex encoding of bytes",
        files={"src/lib.rs": lib, "build.rs": _build_rs(harness), "README.md": "# tinyhex\n"},
    )


@pytest.fixture(scope="module")
def registry(harness: Harness, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DirectoryRegistry]:
    found = DirectoryRegistry(
        write_registry(tmp_path_factory.mktemp("registry"), [_tinyhex(harness), _tinyshout(harness)]),
        tmp_path_factory.mktemp("index"),
    )
    yield found
    found.close()


def _tool_replies(harness: Harness) -> list[dict[str, Any]]:
    return [
        reply(TINYHEX_CONTRACT, call("write_file", path="src/main.rs", content=_main_rs(harness))),
        reply(call("finish", summary="tinyhex prints its standard input as hex")),
    ]


def _settings(cache: Path, registry: DirectoryRegistry, server: FakeOpenAIServer | None, **more: Any) -> Settings:
    if server is not None:
        more.update(model="scripted-test-double", base_url=server.base_url)
    return Settings(cache_dir=cache, registry=str(registry.path), **{"backend": "cargo", "model": None, **more})


def _assert_sandboxed(harness: Harness, recorder: Recorder, *, crate_ran: bool = True) -> None:
    """No toolchain process and no crate code outside the sandbox; git read no crate-written config."""
    outside = harness.outside()
    assert outside == [], "ran outside the sandbox:\n" + "\n".join("\t".join(r) for r in outside)
    git = harness.git()
    assert git, "flakebot ran no git through the wrapper: the recording toolchain was not first on PATH"
    planted = [r for r in git if len(r) > 4 and r[4].strip()]
    assert planted == [], "git could read crate-written configuration:\n" + "\n".join("\t".join(r) for r in planted)
    lines = [e.line for e in recorder.of(LogLine)]
    assert any("TEST-WRAPPER cargo inside the sandbox" in line for line in lines), "no cargo ran through the wrappers"
    if crate_ran:
        assert any("INVARIANT build.rs ran" in line for line in lines), "the crate's build script never ran"


# -- the doors ---------------------------------------------------------------------------------


def test_fork_edit_candidates_examples_help_and_continue_run_the_toolchain_only_in_the_sandbox(
    recording: Harness, registry: DirectoryRegistry, tmp_path: Path
) -> None:
    replies = _tool_replies(recording)
    script = {"candidates": {"0": replies, "1": replies}}
    recorder = Recorder()
    with FakeOpenAIServer(script) as server:
        settings = _settings(tmp_path / "cache", registry, server)
        tool = Pipeline(settings, observers=[recorder]).run(
            BuildRequest(PersonText(REQUEST + EXAMPLES), crate="tinyhex", name="hexer", flags=RunFlags(candidates=2))
        )
    assert tool.acceptance is not None and tool.acceptance.ok, tool.acceptance  # the examples ran, confined
    assert "Usage: tinyhex" in tool.help  # the --help probe ran the built binary
    _assert_sandboxed(recording, recorder)

    # --continue: a copy of the workspace, a new session, a new build
    recording.clear()
    recorder = Recorder()
    with FakeOpenAIServer([reply(call("finish", summary="nothing to change"))]) as server:
        settings = _settings(tmp_path / "cache", registry, server)
        Pipeline(settings, observers=[recorder]).run(BuildRequest("keep it as it is", name="hexer", follow_up=True))
    _assert_sandboxed(recording, recorder)


def test_a_killed_session_resumed_runs_the_toolchain_only_in_the_sandbox(
    recording: Harness, registry: DirectoryRegistry, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    done = _tool_replies(recording)[1]
    script = [
        reply(
            TINYHEX_CONTRACT, call("write_file", path="src/main.rs", content=_main_rs(recording)), call("run_checks")
        ),
        {**reply(call("finish", summary="never seen")), "delay": 120.0},  # the process dies waiting for this
        done,
    ]
    recorder = Recorder()
    with FakeOpenAIServer(script) as server:
        kill_when(server, cache, registry, requests=2)  # a child process: the wrappers are its PATH too
        settings = _settings(cache, registry, server)
        tool = Pipeline(settings, observers=[recorder]).run(BuildRequest("", name="hexer", flags=RunFlags(resume=True)))
    assert tool.provenance.get("iterations")  # the resumed session's work was deployed
    _assert_sandboxed(recording, recorder)


def test_flakebot_cargo_runs_in_the_sandbox(recording: Harness, registry: DirectoryRegistry, tmp_path: Path) -> None:
    from flakebot_magic.manage.workspace_cargo import run_cargo

    settings = _settings(tmp_path / "cache", registry, None)
    Pipeline(settings).run(BuildRequest("", crate="tinyshout", name="shout"))
    recording.clear()
    recorder = Recorder()
    assert run_cargo(settings, "shout", ["test"], observers=[recorder]) == 0
    assert any("test result: ok. 1 passed" in e.line for e in recorder.of(LogLine))
    _assert_sandboxed(recording, recorder)


def test_fork_and_build_from_crates_io_download_only_in_the_fetch_profile(recording: Harness, tmp_path: Path) -> None:
    from flakebot_magic.registry.cratesio import CratesIoRegistry
    from flakebot_magic.testing.fake_cratesio import FakeCrate, FakeCratesIo

    dependency = FakeCrate("tinydep", "0.1.0", files={"src/lib.rs": "pub fn twice(x: u32) -> u32 {\n    2 * x\n}\n"})
    manifest = (
        '[package]\nname = "tinyweb"\nversion = "0.1.0"\nedition = "2021"\nlicense = "MIT"\n'
        'description = "Doubles a number"\n\n[dependencies]\ntinydep = "0.1"\n'
    )
    main = 'fn main() {\n    println!("{}", tinydep::twice(21));\n}\n'
    tool_crate = FakeCrate(
        "tinyweb",
        "0.1.0",
        description="Doubles a number",
        bin_names=["tinyweb"],
        files={"Cargo.toml": manifest, "src/main.rs": main, "build.rs": _build_rs(recording)},
    )
    recorder = Recorder()
    with FakeCratesIo([dependency, tool_crate]) as fake:
        registry = CratesIoRegistry(api_url=fake.url, index_url=fake.index_url, min_interval=0.0)
        settings = Settings(cache_dir=tmp_path / "cache", registry=fake.url, backend="cargo", model=None)
        tool = Pipeline(settings, registry=registry, observers=[recorder]).run(
            BuildRequest(PersonText(">>> doubler()\n42\n"), crate="tinyweb", name="doubler")
        )
        downloads = [r.path for r in fake.requests if r.path.endswith("/download") or "/static/" in r.path]
        registry.close()
    assert tool.acceptance is not None and tool.acceptance.ok, tool.acceptance  # it ran, confined
    assert any("tinydep" in path for path in downloads), downloads  # cargo downloaded, in the fetch profile
    _assert_sandboxed(recording, recorder)


@pytest.mark.nix
@pytest.mark.skipif(shutil.which("nix") is None, reason="nix is not installed (run scripts/setup-nix.sh as root)")
def test_nix_builds_in_nix_sandbox_and_the_rest_in_ours(
    recording: Harness, registry: DirectoryRegistry, tmp_path: Path
) -> None:
    settings = _settings(tmp_path / "cache", registry, None, backend="nix", nixpkgs=f"path:{STAND_IN}")
    recorder = Recorder()
    tool = Pipeline(settings, observers=[recorder]).run(
        BuildRequest(PersonText('>>> nixshout(b"hi")\n6869\n'), crate="tinyshout", name="nixshout")
    )
    assert tool.acceptance is not None and tool.acceptance.ok, tool.acceptance
    _assert_sandboxed(recording, recorder)
    # the build script ran in nix's builder (its log line, in the build stage), in namespaces not the host's
    built = [e.line for e in recorder.of(LogLine) if e.stage == "build" and "INVARIANT build.rs ran" in e.line]
    assert built, "the nix build's log shows no build script"
    host_pid = os.readlink("/proc/self/ns/pid")
    assert all(host_pid not in line for line in built), built


def test_the_log_sees_a_toolchain_process_outside(recording: Harness, tmp_path: Path) -> None:
    """The harness itself: a cargo started outside the sandbox is recorded (the check can fail)."""
    done = subprocess.run(["cargo", "--version"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [r[0] for r in recording.outside()][:1] == ["cargo"]
    record = json.dumps(recording.outside())
    assert str(tmp_path) in record
