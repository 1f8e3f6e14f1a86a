"""A team on Nix, for real (issue 24): the proof as a signed store path, push, and a teammate's pull pinned by hash.

Real nix, real keys (``nix key generate-secret``), a real signed ``file://``
binary cache. The teammate is a second nix store on this machine (a chroot
store, ``local?root=…``) with a flakebot cache of its own: the pulled path
never comes from, nor goes to, the first store. One tool (tinyecho) is built
once for the module; every test reuses it.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
from IPython.core.error import UsageError as IPythonUsageError
from IPython.core.interactiveshell import InteractiveShell
from tinycrates import Recorder, crate, write_registry
from traitlets.config import Config

import flakebot_magic
from flakebot_magic.backends.nix_cache import (
    PathInfo,
    TrustedKeys,
    fetch_derivation,
    nix_base32,
    public_key,
    push_paths,
    signer_of,
)
from flakebot_magic.backends.nix_command import Nix
from flakebot_magic.cli import main as cli_main
from flakebot_magic.clients.base import ToolClient
from flakebot_magic.commands import typed
from flakebot_magic.config import Settings
from flakebot_magic.errors import SearchError, UntrustedPath, UsageError
from flakebot_magic.events import Notice
from flakebot_magic.host.git import Git
from flakebot_magic.host.process import Completed, ProcessRunner
from flakebot_magic.manage.cleanup import clean
from flakebot_magic.manage.doctor import doctor
from flakebot_magic.manage.export import export_replit
from flakebot_magic.manage.tools import load, show
from flakebot_magic.manage.verify import rebuild_source, verify
from flakebot_magic.pipeline import Pipeline, team
from flakebot_magic.records.inventory import Inventory
from flakebot_magic.records.proof import Proof
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.stages.build import proof_key


def _real(test: Any) -> Any:
    return pytest.mark.nix(pytest.mark.cargo(test))


NIX = shutil.which("nix")
TEAM_CACHE = Path(__file__).resolve().parents[2] / "scripts" / "team-cache.sh"
#: the nixpkgs stand-in the nix tests build against (see tests/nixpkgs)
STAND_IN = Path(__file__).resolve().parents[1] / "nixpkgs"


def _nix(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [NIX or "nix", "--extra-experimental-features", "nix-command flakes", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if check:
        assert done.returncode == 0, done.stderr[-2000:]
    return done


def _key(folder: Path, name: str) -> tuple[Path, str]:
    """A signing key pair and a cache directory, as scripts/team-cache.sh makes them for a team."""
    done = subprocess.run(["bash", str(TEAM_CACHE), str(folder), name], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"FLAKEBOT_PUSH_TO=file://{folder}/cache" in done.stdout
    return folder / "secret-key", (folder / "public-key").read_text().strip()


class Team:
    """The module's one build, its keys, a signed cache and the notebook that recorded the tool."""

    def __init__(self, root: Path, registry: str) -> None:
        self.root = root
        self.secret, self.public = _key(root / "team", "team-test-1")
        self.evil_secret, self.evil_public = _key(root / "evil", "evil-1")
        self.cache = f"file://{root / 'team' / 'cache'}"
        # --push: every successful build goes to the cache on its own (here a second one, "auto")
        self.settings = Settings(
            cache_dir=root / "alice",
            registry=registry,
            backend="nix",
            nixpkgs=f"path:{STAND_IN}",
            push_after_build=True,
            push_to=f"file://{root / 'auto'}",
            nix_secret_key=str(self.secret),
        )
        self.recorder = Recorder()
        self.tool: Any = Pipeline(self.settings, observers=[self.recorder]).run("", crate="tinyecho", name="echo")
        self.provenance: dict[str, Any] = self.tool._repr_mimebundle_()[1]["flakebot"]
        self.notebook = root / "shared.ipynb"
        cell = nbformat.v4.new_code_cell("%%flakebot --name echo --crate tinyecho\necho its arguments")
        cell.outputs = [
            nbformat.v4.new_output(
                "execute_result", data={"text/plain": "echo"}, metadata={"flakebot": self.provenance}, execution_count=1
            )
        ]
        nbformat.write(nbformat.v4.new_notebook(cells=[cell]), self.notebook)

    def mate(self, name: str, *, cache: str | None = None, keys: str | None = None) -> Settings:
        """A teammate: a flakebot cache of its own and a nix store of its own."""
        return Settings(
            cache_dir=self.root / name,
            registry=self.settings.registry,
            backend="nix",
            nixpkgs=f"path:{STAND_IN}",
            nix_store=f"local?root={self.root / name / 'nix-root'}",
            nix_substituters=cache or self.cache,
            nix_trusted_public_keys=keys if keys is not None else self.public,
        )


@pytest.fixture(scope="module")
def built(nix_ready: None, session_registry: DirectoryRegistry, tmp_path_factory: pytest.TempPathFactory) -> Team:
    return Team(tmp_path_factory.mktemp("team"), str(session_registry.path))


@pytest.fixture(scope="module")
def pushed(built: Team) -> Team:
    code = cli_main(
        [
            "push",
            "echo",
            "--cache-dir",
            str(built.settings.cache_dir),
            "--to",
            built.cache,
            "--secret-key",
            str(built.secret),
        ]
    )
    assert code == 0
    return built


class CountingRunner(ProcessRunner):
    """A real runner that remembers every command it ran."""

    def __init__(self) -> None:
        super().__init__()
        self.argvs: list[list[str]] = []

    def run(self, args: Any, **kwargs: Any) -> Completed:  # type: ignore[override]
        self.argvs.append([os.fspath(a) for a in args])
        return super().run(args, **kwargs)


# -- the proof ----------------------------------------------------------------


@_real
def test_the_proof_is_a_store_path_that_names_the_tool(built: Team) -> None:
    manifest = built.tool.provenance
    proof_path = manifest["proof_store_path"]
    assert proof_path.startswith("/nix/store/") and proof_path.endswith("-flakebot-proof-tinyecho-0.2.0")
    proof = Proof.from_text((Path(proof_path) / "proof.json").read_text())
    info = json.loads(_nix("path-info", "--json", str(built.tool.store_path)).stdout)[0]
    assert proof.tool == str(built.tool.store_path) and proof.nar_hash == info["narHash"] == manifest["nar_hash"]
    assert proof.passed and proof.tests["passed"] >= 1
    assert proof.key.toolchain.startswith("rustc ") and proof.backend == "nix"
    # the one ProofKey: what this machine's proof cache computes for the workspace the tool was built from
    workspace = built.settings.cache.workspaces / "echo"
    git = Git(workspace, ProcessRunner())
    assert proof.key == proof_key(workspace, git, proof.key.toolchain, proof.key.flags)
    assert proof.flake_lock == built.tool.lock_hash
    assert proof.flakebot_version and proof.contract and proof.main == "tinyecho"
    # what the notebook recorded pins both paths by hash
    for key in ("nix_store_path", "nar_hash", "proof_store_path", "proof_nar_hash"):
        assert built.provenance[key], key
    # kept alive like the tool
    assert Path(os.readlink(built.settings.cache.gcroots / ".proofs" / "echo")) == Path(proof_path)


# -- push ---------------------------------------------------------------------


@_real
def test_push_signs_the_tool_and_its_proof(pushed: Team) -> None:
    for path in (pushed.provenance["nix_store_path"], pushed.provenance["proof_store_path"]):
        # nix itself checks the signature in the cache against the public key
        done = _nix(
            "store",
            "verify",
            "--store",
            pushed.cache,
            "--sigs-needed",
            "1",
            "--option",
            "trusted-public-keys",
            pushed.public,
            path,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        narinfo = (pushed.root / "team" / "cache" / f"{Path(path).name.split('-')[0]}.narinfo").read_text()
        assert "Sig: team-test-1:" in narinfo


@_real
def test_push_after_build_pushes_tool_and_proof_signed(built: Team) -> None:
    notices = [n.message for n in built.recorder.of(Notice)]
    assert "pushed to file://" + str(built.root / "auto") + " with its derivation, signed by team-test-1" in notices, (
        notices
    )
    trusted = TrustedKeys(built.public)
    for path in (built.provenance["nix_store_path"], built.provenance["proof_store_path"]):
        data = json.loads(
            _nix("path-info", "--json", "--sigs", "--store", f"file://{built.root / 'auto'}", path).stdout
        )
        info = PathInfo(path, data[0]["narHash"], data[0]["narSize"], (), tuple(data[0]["signatures"]))
        assert signer_of(info, trusted) == "team-test-1"


@_real
def test_push_needs_a_key_and_a_nix_tool(pushed: Team, capsys: pytest.CaptureFixture[str]) -> None:
    cache_dir = str(pushed.settings.cache_dir)
    assert cli_main(["push", "echo", "--cache-dir", cache_dir, "--to", pushed.cache]) == 1
    assert "--secret-key" in capsys.readouterr().err
    assert cli_main(["push", "nosuch", "--cache-dir", cache_dir, "--to", pushed.cache, "--secret-key", "/x"]) == 1
    assert "No tool named 'nosuch'" in capsys.readouterr().err


# -- pull ---------------------------------------------------------------------


@_real
@pytest.mark.parametrize("point", ["push.derivation", "push.tool", "push.proof"])
def test_after_a_push_killed_midway_the_pull_names_the_push_that_did_not_finish(
    built: Team, tmp_path: Path, point: str
) -> None:
    """Issue 34: a push killed after the tool went (before its derivation, in the old order) made the pull blame
    "pushed before derivations were". A push puts the derivation, the tool, then the proof: killed anywhere, the
    pull says the push did not finish, and what to run; killed after the proof, there is nothing to say."""
    cache = f"file://{tmp_path / 'cache'}"
    argv = ["push", "echo", "--cache-dir", str(built.settings.cache_dir), "--to", cache]
    env = {**os.environ, "FLAKEBOT_CRASH_AT": point}
    command = [sys.executable, "-m", "flakebot_magic.cli", *argv, "--secret-key", str(built.secret)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == -9, done.stderr  # killed at the point
    mate = built.mate(f"mate-{point.replace('.', '-')}", cache=cache)
    if point == "push.proof":  # the push was whole: the pull works, and the derivation came along
        pulled = team.pull(mate, "echo", built.provenance)
        assert "verify echo" in pulled.notes[0], pulled.notes
        return
    with pytest.raises(UntrustedPath) as caught:
        team.pull(mate, "echo", built.provenance)
    message = str(caught.value)
    assert "its push did not finish" in message and typed("push NAME") in message, message
    assert "before derivations" not in message, message


@_real
def test_a_teammate_pulls_the_exact_tool_without_building(pushed: Team) -> None:
    mate = pushed.mate("bob")
    runner = CountingRunner()
    provenance = team.notebook_provenance(pushed.notebook, "echo")
    pulled = team.pull(mate, "echo", provenance, runner=runner)
    tool = pulled.tool
    assert str(tool.store_path) == pushed.provenance["nix_store_path"]
    assert tool("hello", "team", input="") == "hello team\n"
    assert tool.provenance["substituted_from"] == pushed.cache and tool.provenance["signed_by"] == "team-test-1"
    assert pulled.signed_by == "team-test-1"
    # the same tool as on the machine that built it: the same source hash (the builder's store key)
    assert tool.source_hash == pushed.tool.source_hash
    # no fork, no cargo, no model: nix commands only, each on the teammate's store or the cache, never the first
    programs = {Path(argv[0]).name for argv in runner.argvs}
    assert programs <= {"nix", "nix-store"}, programs
    for argv in runner.argvs:
        stores = [argv[i + 1] for i, word in enumerate(argv) if word == "--store"]
        assert stores and set(stores) <= {mate.nix_store, pushed.cache}, argv
    root = Path(str(mate.nix_store).partition("root=")[2])
    assert (root / pushed.provenance["nix_store_path"].lstrip("/") / "bin" / "tinyecho").is_file()
    assert not (mate.cache_dir / "workspaces" / "echo").exists()
    # the teammate's kernel restarts: the tool comes back from its record, as any other
    again = load(mate, "echo")
    assert again("back", input="") == "back\n"
    record = Inventory(mate.cache.tools).get("echo")
    assert record is not None and record.extra["signed_by"] == "team-test-1"


@_real
def test_the_command_pulls_into_a_second_store(pushed: Team, capsys: pytest.CaptureFixture[str]) -> None:
    mate = pushed.mate("carol")
    code = cli_main(
        [
            "pull",
            "echo",
            "--from",
            str(pushed.notebook),
            "--cache-dir",
            str(mate.cache_dir),
            "--store",
            str(mate.nix_store),
            "--substituters",
            pushed.cache,
            "--trusted-public-keys",
            pushed.public,
            "--json",
        ]
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    shown = json.loads(out.out)
    assert shown["provenance"]["substituted_from"] == pushed.cache, shown


def _refused(mate: Settings, provenance: dict[str, Any]) -> UntrustedPath:
    with pytest.raises(UntrustedPath) as refused:
        team.pull(mate, "echo", provenance)
    root = Path(str(mate.nix_store).partition("root=")[2])
    assert not (root / provenance["nix_store_path"].lstrip("/")).exists()  # nothing fetched
    assert Inventory(mate.cache.tools).get("echo") is None  # nothing registered, nothing to inject
    assert "--if-untrusted rebuild" in str(refused.value)
    return refused.value


@_real
def test_a_path_signed_by_another_key_is_refused(pushed: Team, tmp_path: Path) -> None:
    evil = f"file://{tmp_path / 'evil-cache'}"
    paths = [pushed.provenance["nix_store_path"], pushed.provenance["proof_store_path"]]
    _nix("copy", "--to", f"{evil}?secret-key={pushed.evil_secret}", *paths)
    error = _refused(pushed.mate("eve", cache=evil), pushed.provenance)
    assert "evil-1" in str(error) and "not by a trusted key" in str(error)
    # trusting the other key too does not help an unsigned path
    unsigned = f"file://{tmp_path / 'unsigned'}"
    _nix("copy", "--to", unsigned, *paths)
    error = _refused(
        pushed.mate("dan", cache=unsigned, keys=f"{pushed.public} {pushed.evil_public}"), pushed.provenance
    )
    assert "signed by nobody" in str(error)


@_real
def test_a_hash_other_than_the_recorded_one_is_refused(pushed: Team) -> None:
    forged = {**pushed.provenance, "nar_hash": "sha256-" + base64.b64encode(bytes(32)).decode()}
    error = _refused(pushed.mate("fay"), forged)
    assert "not the recorded" in str(error)


@_real
def test_refused_then_rebuilt_here_says_it_is_bit_identical(pushed: Team, tmp_path: Path) -> None:
    unsigned = f"file://{tmp_path / 'unsigned'}"
    _nix("copy", "--to", unsigned, pushed.provenance["nix_store_path"], pushed.provenance["proof_store_path"])
    mate = pushed.mate("gus", cache=unsigned)  # refused into its own store; rebuilt in nix's own
    pulled = team.pull(mate, "echo", team.notebook_provenance(pushed.notebook, "echo"), if_untrusted="rebuild")
    assert pulled.refused and "signed by nobody" in pulled.refused
    assert pulled.identical is True and "bit-identical" in pulled.text
    assert isinstance(pulled.tool, ToolClient) and pulled.tool("x", input="") == "x\n"


@_real
def test_pull_without_keys_or_caches_says_what_to_set(pushed: Team) -> None:
    with pytest.raises(UsageError, match="--trusted-public-keys"):
        team.pull(pushed.mate("hal", keys=""), "echo", pushed.provenance)
    with pytest.raises(UsageError, match="records no tool named 'nosuch'"):
        team.notebook_provenance(pushed.notebook, "nosuch")
    with pytest.raises(UsageError, match="not a nix public key"):
        TrustedKeys("team:short")


# -- verify ---------------------------------------------------------------------

#: a crate whose binary embeds the moment its build script ran: no two builds are the same
STAMPED = crate(
    "stamped",
    description="Prints when it was built",
    manifest='[package]\nname = "stamped"\nversion = "0.1.0"\nedition = "2021"\nbuild = "build.rs"\n',
    files={
        "build.rs": (
            "fn main() {\n"
            "    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();\n"
            '    println!("cargo:rustc-env=STAMP={}", t.as_nanos());\n'
            "}\n"
        ),
        "src/main.rs": 'fn main() {\n    println!("built at {}", env!("STAMP"));\n}\n',
    },
)


@_real
def test_verify_says_an_honest_build_is_bit_identical(built: Team, capsys: pytest.CaptureFixture[str]) -> None:
    settings = built.settings
    code = cli_main(["verify", "echo", "--cache-dir", str(settings.cache_dir), "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    answer = json.loads(out.out)
    assert answer["identical"] is True and answer["message"] == ""
    assert answer["path"] == built.provenance["nix_store_path"] and answer["nar_hash"] == built.provenance["nar_hash"]
    assert answer["rebuilt_from"].endswith(".drv")  # the recorded derivation, which this store still holds
    # the answer is in the tool's provenance: its record, and what show prints
    record = Inventory(settings.cache.tools).get("echo")
    assert record is not None and record.extra["verified"] == answer
    assert cli_main(["show", "echo", "--cache-dir", str(settings.cache_dir)]) == 0
    shown = capsys.readouterr().out
    line = next(line for line in shown.splitlines() if line.startswith("verified "))
    assert f" bit-identical to {answer['path']} ({answer['nar_hash']}): rebuilt 20" in line, shown
    assert "NOT" not in line
    # without the derivation, the workspace's flake at the recorded commit names the very same store path
    nix = Nix(ProcessRunner())
    source, _ = rebuild_source(nix, record, answer["path"], "", built.tool.provenance["commit"])
    assert source.startswith("git+file://") and "?rev=" in source
    assert _nix("path-info", source).stdout.strip() == answer["path"]


@_real
def test_a_teammate_verifies_a_pulled_tool_by_rebuilding_it(pushed: Team) -> None:
    # the proof names the derivation; the push carried it (sources and recipe) to the cache, signed like the tool
    proof = Proof.from_text((Path(pushed.provenance["proof_store_path"]) / "proof.json").read_text())
    assert proof.derivation.endswith(".drv") and proof.derivation.startswith("/nix/store/")
    trusted = TrustedKeys(pushed.public)
    served = json.loads(
        _nix("path-info", "--json", "--sigs", "--derivation", "--store", pushed.cache, proof.derivation).stdout
    )[0]
    references = tuple(served["references"])
    info = PathInfo(proof.derivation, served["narHash"], served["narSize"], references, tuple(served["signatures"]))
    assert signer_of(info, trusted) == "team-test-1"
    # a teammate pulls it: the derivation comes along, and the pull says the tool can be verified here
    mate = pushed.mate("dana")
    pulled = team.pull(mate, "echo", pushed.provenance)
    assert pulled.notes == (
        f"its derivation came with it: {typed('verify echo')} rebuilds it here and compares bit for bit",
    )
    root = Path(str(mate.nix_store).partition("root=")[2])
    assert (root / proof.derivation.lstrip("/")).is_file()
    # verify rebuilds it in the teammate's own store, from that derivation, and nix finds it bit-identical
    runner = CountingRunner()
    verified = verify(mate, "echo", runner=runner)
    assert verified.identical, verified.message
    assert verified.rebuilt_from == proof.derivation and verified.path == pushed.provenance["nix_store_path"]
    builds = [argv for argv in runner.argvs if "build" in argv and "--rebuild" in argv]
    assert builds and all(argv[argv.index("--store") + 1] == mate.nix_store for argv in builds), runner.argvs
    record = Inventory(mate.cache.tools).get("echo")
    assert record is not None and record.extra["verified"]["identical"] is True


@_real
def test_a_derivation_that_does_not_build_the_tool_is_not_taken(pushed: Team, tmp_path: Path) -> None:
    proof = Proof.from_text((Path(pushed.provenance["proof_store_path"]) / "proof.json").read_text())
    mate = pushed.mate("erin")
    nix = Nix(ProcessRunner()).on_store(str(mate.nix_store))
    trusted = TrustedKeys(pushed.public)
    tool = pushed.provenance["nix_store_path"]
    # an input's derivation, in the cache and signed, but it builds something else
    inputs = json.loads(_nix("show-derivation", proof.derivation).stdout)[proof.derivation]["inputDrvs"]
    other = next(iter(inputs))
    said = fetch_derivation(nix, pushed.cache, other, tool, trusted)
    assert said == f"its derivation {other} does not build {tool}"
    # not a store path, not a .drv, not signed by a trusted key, not there: each says so and fetches nothing
    for value, words in (
        ("--option substituters http://x", "which is not a .drv store path"),
        (tool, "which is not a .drv store path"),
        ("/nix/store/" + "0" * 32 + "-gone.drv", "does not hold its derivation"),
    ):
        assert words in fetch_derivation(nix, pushed.cache, value, tool, trusted)
    evil = TrustedKeys(pushed.evil_public)
    assert "is not signed by a trusted key" in fetch_derivation(nix, pushed.cache, proof.derivation, tool, evil)


@_real
def test_verify_reports_a_build_that_is_not_deterministic(built: Team, tmp_path: Path) -> None:
    registry = write_registry(tmp_path / "registry", [STAMPED])
    settings = Settings(cache_dir=tmp_path / "cache", registry=str(registry), backend="nix", nixpkgs=f"path:{STAND_IN}")
    tool: Any = Pipeline(settings).run("", crate="stamped", name="stamp")
    assert tool(input="").startswith("built at ")
    answer = verify(settings, "stamp")
    path = tool.provenance["nix_store_path"]
    assert answer.identical is False and answer.path == path
    # nix's own words on the difference
    assert "may not be deterministic" in answer.message and f"output '{path}' differs" in answer.message
    shown = show(settings, "stamp").text
    assert f"NOT bit-identical to {path}" in shown and "nix: derivation '" in shown, shown
    # the tool that was deployed is untouched, and still works
    assert tool(input="") == tool(input="")
    # a recorded narHash other than the store's: not identical, and no rebuild can say otherwise
    record = Inventory(settings.cache.tools).get("stamp")
    assert record is not None
    manifest = Path(record.store_path) / "manifest.json"
    forged = "sha256-" + base64.b64encode(bytes(32)).decode()
    os.chmod(manifest, 0o644)
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "nar_hash": forged}))
    answer = verify(settings, "stamp")
    assert answer.identical is False and answer.rebuilt_from == "" and f"not the recorded {forged}" in answer.message


@_real
def test_verify_of_what_cannot_be_rebuilt_says_why(built: Team, pushed: Team) -> None:
    # a cargo-backend tool: no derivation to rebuild
    cargo = dataclasses.replace(built.settings, backend="cargo", push_after_build=False)
    Pipeline(cargo).run("", crate="tinyecho", name="echo_cargo")
    with pytest.raises(UsageError, match="verify needs the nix backend: 'echo_cargo' was built by cargo"):
        verify(built.settings, "echo_cargo")
    with pytest.raises(UsageError, match="No tool named 'nosuch'"):
        verify(built.settings, "nosuch")
    # a pulled tool from a cache that holds the tool and its proof but not its derivation (pushed by hand, or
    # before pushes carried derivations): neither its derivation nor its flake is on this machine
    bare = f"file://{built.root / 'bare-cache'}"
    nix = Nix(ProcessRunner())
    push_paths(nix, [pushed.provenance["nix_store_path"], pushed.provenance["proof_store_path"]], bare, pushed.secret)
    mate = pushed.mate("kim", cache=bare)
    pulled = team.pull(mate, "echo", pushed.provenance)
    assert pulled.notes and "cannot be rebuilt here to verify it" in pulled.notes[0], pulled.notes
    assert f"{bare} does not hold its derivation" in pulled.notes[0]
    with pytest.raises(UsageError, match=f"Nothing to rebuild 'echo' from: it was pulled from {bare}"):
        verify(mate, "echo")
    assert "verified" not in (Inventory(mate.cache.tools).get("echo") or pytest.fail("gone")).extra
    # the magic: a clear error, no traceback
    config = Config()
    config.FlakebotMagics.progress = "none"
    shell = InteractiveShell(config=config)
    try:
        shell.extension_manager.load_extension("flakebot_magic")
        shell.run_line_magic("config", f"FlakebotMagics.cache_dir = {str(built.settings.cache_dir)!r}")
        for line, message in (("verify echo_cargo", "needs the nix backend"), ("verify", "Usage: %flakebot verify")):
            with pytest.raises(IPythonUsageError, match=message):
                shell.run_line_magic("flakebot", line)
    finally:
        shell.extension_manager.unload_extension("flakebot_magic")
        InteractiveShell.clear_instance()


# -- the signature check itself -------------------------------------------------


@_real
def test_signer_of_checks_the_ed25519_signature_nix_made(pushed: Team) -> None:
    path = pushed.provenance["nix_store_path"]
    data = json.loads(_nix("path-info", "--json", "--sigs", "--store", pushed.cache, path).stdout)[0]
    info = PathInfo(path, data["narHash"], data["narSize"], tuple(data["references"]), tuple(data["signatures"]))
    trusted = TrustedKeys(pushed.public)
    assert signer_of(info, trusted) == "team-test-1"
    assert signer_of(info, TrustedKeys(pushed.evil_public)) is None
    # any change to what was signed breaks it: size, hash, references
    assert (
        signer_of(PathInfo(path, info.nar_hash, info.nar_size + 1, info.references, info.signatures), trusted) is None
    )
    other = "sha256-" + base64.b64encode(bytes(32)).decode()
    assert signer_of(PathInfo(path, other, info.nar_size, info.references, info.signatures), trusted) is None
    assert signer_of(PathInfo(path, info.nar_hash, info.nar_size, (path,), info.signatures), trusted) is None
    # the fingerprint's hash is nix's own base-32
    narinfo = (pushed.root / "team" / "cache" / f"{Path(path).name.split('-')[0]}.narinfo").read_text()
    assert f"NarHash: sha256:{nix_base32(base64.b64decode(info.nar_hash[7:]))}" in narinfo


# -- the magic ------------------------------------------------------------------


@_real
def test_the_magic_pushes_and_pulls_into_the_kernel(pushed: Team, tmp_path: Path) -> None:
    mate = pushed.mate("ivy")
    config = Config()
    config.FlakebotMagics.progress = "none"
    shell = InteractiveShell(config=config)
    try:
        shell.extension_manager.load_extension("flakebot_magic")
        again = f"file://{tmp_path / 'again'}"
        shell.run_line_magic("config", f"FlakebotMagics.cache_dir = {str(pushed.settings.cache_dir)!r}")
        shell.run_line_magic("flakebot", f"push echo --push-to {again} --secret-key {pushed.secret}")
        assert list((tmp_path / "again").glob("*.narinfo"))
        shell.run_line_magic("config", f"FlakebotMagics.cache_dir = {str(mate.cache_dir)!r}")
        line = (
            f"pull echo {pushed.notebook} --store {mate.nix_store} "
            f"--substituters {again} --trusted-public-keys {pushed.public}"
        )
        shell.run_line_magic("flakebot", line)
        assert shell.user_ns["echo"]("kernel", input="") == "kernel\n"
        with pytest.raises(IPythonUsageError, match="NOTEBOOK"):
            shell.run_line_magic("flakebot", "pull echo")
    finally:
        shell.extension_manager.unload_extension("flakebot_magic")
        InteractiveShell.clear_instance()


@_real
def test_rerunning_a_saved_cell_pulls_the_tool_the_notebook_pinned(
    pushed: Team, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the notebook as a teammate receives it: the cell, and its output's metadata (the pin)
    notebook = tmp_path / "analysis.ipynb"
    cell = nbformat.v4.new_code_cell("%%flakebot --name echo --crate tinyecho\n")
    assert pushed.provenance["request"] == ""  # the module's tool was built from its crate alone
    cell.outputs = [
        nbformat.v4.new_output("execute_result", data={"text/plain": "echo"}, metadata={"flakebot": pushed.provenance})
    ]
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), notebook)
    mate = pushed.mate("lea")
    # what decides: this very request and crate, a nix tool with a proof, and no tool of that name here
    assert team.saved_pin(mate, str(notebook), "echo", "", "tinyecho") is not None
    for session, name, request, asked in (
        (None, "echo", "", None),  # not in a Jupyter notebook
        (str(tmp_path / "missing.ipynb"), "echo", "", None),
        (str(notebook), "other", "", None),
        (str(notebook), "echo", "Echo, but louder.", None),  # the cell was edited: a new request
        (str(notebook), "echo", "", "tinyhex"),
        (str(notebook), None, "", None),
    ):
        assert team.saved_pin(mate, session, name, request, asked) is None, (session, name, request, asked)
    assert team.saved_pin(pushed.settings, str(notebook), "echo", "", None) is None  # alice has her own echo
    config = Config()
    config.FlakebotMagics.progress = "none"
    shell = InteractiveShell(config=config)
    try:
        shell.extension_manager.load_extension("flakebot_magic")
        shell.run_line_magic("config", f"FlakebotMagics.cache_dir = {str(mate.cache_dir)!r}")
        shell.user_ns["__session__"] = str(notebook)  # what ipykernel sets from Jupyter's JPY_SESSION_NAME
        options = f"--store {mate.nix_store} --substituters {pushed.cache} --trusted-public-keys {pushed.public}"
        # (a body of white space: IPython refuses an empty one; flakebot compares the request stripped)
        tool = shell.run_cell_magic("flakebot", f"--name echo --crate tinyecho {options}", "\n")
        out = capsys.readouterr().out
        assert f"pulled {pushed.provenance['nix_store_path']} from {pushed.cache}" in out, out
        assert "as analysis.ipynb pinned it (no build)" in out and "flakebot verify echo" in out, out
        assert shell.user_ns["echo"] is tool and tool("again", input="") == "again\n"
        assert tool._repr_mimebundle_()[1]["flakebot"]["nar_hash"] == pushed.provenance["nar_hash"]  # pinned again
        assert not (mate.cache_dir / "workspaces" / "echo").exists()  # nothing was forked or built
        # a refused pull (a key that signed nothing here) is a notice, and the cell builds instead: here the
        # build then fails fast on an empty registry, which shows that it was tried
        other = pushed.mate("max")
        shell.run_line_magic("config", f"FlakebotMagics.cache_dir = {str(other.cache_dir)!r}")
        (tmp_path / "empty-registry").mkdir()
        refused = f"--store {other.nix_store} --substituters {pushed.cache} --trusted-public-keys {pushed.evil_public}"
        with pytest.raises(SearchError, match="no crate named 'tinyecho'"):
            shell.run_cell_magic(
                "flakebot", f"--name echo --crate tinyecho {refused} --registry {tmp_path / 'empty-registry'}", "\n"
            )
        out = capsys.readouterr().out
        assert "analysis.ipynb pins `echo`, but it was not pulled: " in out and "not by a trusted key" in out, out
        assert "flakebot: building it here instead." in out and "--if-untrusted" not in out, out
        # no cache set: a line says how to pull, and the cell builds
        bare = pushed.mate("ned")
        shell.run_line_magic("config", f"FlakebotMagics.cache_dir = {str(bare.cache_dir)!r}")
        with pytest.raises(SearchError):
            shell.run_cell_magic(
                "flakebot", f"--name echo --crate tinyecho --registry {tmp_path / 'empty-registry'}", "\n"
            )
        out = capsys.readouterr().out
        assert f"analysis.ipynb pins `echo` at {pushed.provenance['nix_store_path']}; building it here." in out, out
        assert "FLAKEBOT_NIX_SUBSTITUTERS" in out
        assert "echo" not in shell.user_ns or shell.user_ns["echo"] is tool
    finally:
        shell.extension_manager.unload_extension("flakebot_magic")
        InteractiveShell.clear_instance()


@_real
def test_clean_drops_the_roots_of_a_pulled_tool_that_is_gone(pushed: Team) -> None:
    mate = pushed.mate("jim")
    team.pull(mate, "echo", pushed.provenance)
    checked = doctor(mate)  # a pulled tool (no workspace) is a healthy record
    assert checked.health.ok and checked.problems == [], checked.summary()
    # clean keeps what a pulled tool uses: its roots (to the /nix/store path in the second store) and entry
    assert clean(mate).removed == []
    assert (mate.cache.gcroots / "echo").is_symlink() and (mate.cache.gcroots / ".proofs" / "echo").is_symlink()
    assert load(mate, "echo")("still", input="") == "still\n"
    with pytest.raises(UsageError, match=r"has no flake\.nix"):
        export_replit(mate, "echo", mate.cache_dir / "export")
    # a pulled tool is named in its store entry too (the store is evidence): its record lost, it comes back
    record = Inventory(mate.cache.tools).get("echo")
    assert record is not None
    Inventory(mate.cache.tools).remove("echo")
    assert clean(mate).refused and Inventory(mate.cache.tools).get("echo") is not None
    assert load(mate, "echo")("again", input="") == "again\n"
    # gone for good: its record and its store entry (what a tool is, here)
    Inventory(mate.cache.tools).remove("echo")
    shutil.rmtree(record.store_path)
    report = clean(mate)
    if report.refused:  # the inventory is empty while the store is not: checked against the disk first
        report = clean(mate)
    assert not (mate.cache.gcroots / "echo").is_symlink()
    assert not (mate.cache.gcroots / ".proofs" / "echo").is_symlink()


@_real
def test_load_from_saved_provenance_pulls_once_then_loads(pushed: Team) -> None:
    mate = pushed.mate("kim")
    options = {
        "nix_store": mate.nix_store,
        "nix_substituters": mate.nix_substituters,
        "nix_trusted_public_keys": mate.nix_trusted_public_keys,
    }
    pulled = flakebot_magic.load("echo", cache_dir=mate.cache_dir, notebook=pushed.notebook, **options)
    assert pulled("one", input="") == "one\n" and pulled.provenance["signed_by"] == "team-test-1"
    # the same pin again: the tool registered here is that store path, nothing is fetched (no cache needed)
    again = flakebot_magic.load(
        "echo", cache_dir=mate.cache_dir, provenance=pushed.provenance, **{**options, "nix_substituters": None}
    )
    assert again.provenance["nix_store_path"] == pushed.provenance["nix_store_path"]
    assert again("two", input="") == "two\n"
    with pytest.raises(flakebot_magic.UntrustedPath):
        flakebot_magic.load(
            "other",
            cache_dir=mate.cache_dir,
            provenance=pushed.provenance,
            **{**options, "nix_trusted_public_keys": pushed.evil_public},
        )


# -- keys, without nix ------------------------------------------------------------


@pytest.mark.parametrize("text", ["team:short", "nameless", ":" + base64.b64encode(bytes(32)).decode(), "a:!!!"])
def test_a_bad_trusted_key_says_what_a_key_is(text: str) -> None:
    with pytest.raises(UsageError, match="not a nix public key"):
        TrustedKeys(text)


def test_the_public_half_of_a_secret_key(tmp_path: Path) -> None:
    seed, public = bytes(range(32)), bytes(range(32, 64))
    (tmp_path / "sk").write_text(f"team-1:{base64.b64encode(seed + public).decode()}\n")
    assert public_key(tmp_path / "sk").keys == {"team-1": public}
    (tmp_path / "bad").write_text("team-1:" + base64.b64encode(public).decode())
    with pytest.raises(UsageError, match="not a nix secret key"):
        public_key(tmp_path / "bad")
    with pytest.raises(UsageError, match="Cannot read the signing key"):
        public_key(tmp_path / "missing")


def test_pull_and_push_say_what_is_missing(tmp_path: Path) -> None:
    settings = Settings(cache_dir=tmp_path / "c", backend="nix")
    with pytest.raises(UsageError, match="--to"):
        team.push(settings, "x")
    with pytest.raises(UsageError, match="--secret-key"):
        team.push(settings, "x", to="file:///c")
    with pytest.raises(UsageError, match="no nix_store_path, nar_hash"):
        team.pull(settings, "x", {"name": "x", "backend": "cargo"})
    with pytest.raises(UntrustedPath, match="not one"):  # pins are checked first, before any setting matters
        team.pull(settings, "x", dict.fromkeys(team.PINNED, "x"))
    pinned = {"nix_store_path": GOOD_PATH, "proof_store_path": GOOD_PATH, "nar_hash": GOOD_HASH}
    pinned["proof_nar_hash"] = GOOD_HASH
    with pytest.raises(UsageError, match="--substituters"):
        team.pull(settings, "x", pinned)
    with pytest.raises(UsageError, match="if_untrusted"):
        team.pull(settings, "x", pinned, if_untrusted="maybe")
    (tmp_path / "nb.ipynb").write_text("{")
    with pytest.raises(UsageError, match="Cannot read"):
        team.notebook_provenance(tmp_path / "nb.ipynb", "x")
    with pytest.raises(UsageError) as missing:  # a typo in the name: where it looked, no errno
        team.notebook_provenance(tmp_path / "nonexistent.ipynb", "x")
    assert str(missing.value) == (
        f"No notebook at {tmp_path / 'nonexistent.ipynb'}: give the path of the notebook whose output recorded 'x' "
        "(relative to the kernel's working directory, or absolute)."
    )


# -- pins from a notebook are data: never options of a nix command (the fresh red team's b01, b02) -----------------

GOOD_PATH = "/nix/store/" + "a" * 32 + "-tinyecho-0.2.0"
GOOD_HASH = "sha256-" + base64.b64encode(b"\0" * 32).decode()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("proof_store_path", "-f"),
        ("proof_store_path", "--store"),
        ("nix_store_path", "team-tool.nix"),
        ("nix_store_path", "/var/tmp/planted"),
        ("nix_store_path", "/nix/store/short-x"),
        ("nix_store_path", GOOD_PATH + "/../../etc"),
        ("nix_store_path", GOOD_PATH + "\n--store"),
        ("nar_hash", "--option"),
        ("proof_nar_hash", "sha256-" + "A" * 43),
    ],
)
def test_pins_that_are_not_store_paths_and_hashes_run_nothing(tmp_path: Path, field: str, value: str) -> None:
    runner = CountingRunner()
    provenance = {"nix_store_path": GOOD_PATH, "proof_store_path": GOOD_PATH[:-5] + "proof", "nar_hash": GOOD_HASH}
    provenance = {**provenance, "proof_nar_hash": GOOD_HASH, field: value}
    key = "team-test-1:" + base64.b64encode(b"\1" * 32).decode()
    mate = Settings(cache_dir=tmp_path / "c", backend="nix", nix_substituters=f"file://{tmp_path}/cache")
    mate.nix_trusted_public_keys = key
    with pytest.raises(UntrustedPath, match="nothing was run or fetched"):
        team.pull(mate, "echo", provenance, runner=runner, if_untrusted="rebuild")
    assert runner.argvs == []  # not one command: no nix, no rebuild


def test_every_pinned_value_the_check_passes_is_a_store_path_and_a_hash() -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    from flakebot_magic.backends.nix_cache import check_pins

    @given(st.text(max_size=80), st.text(max_size=60))
    def check(path: str, nar_hash: str) -> None:
        try:
            check_pins({path: nar_hash})
        except UntrustedPath:
            return
        assert path.startswith("/nix/store/") and "/" not in path[len("/nix/store/") :]
        assert not path.startswith("-") and "\n" not in path and ".." not in path.split("/")
        assert nar_hash.startswith("sha256-") and len(nar_hash) == 51

    check()
    check_pins({GOOD_PATH: GOOD_HASH})
