"""The flake stage: render_flake's text (fast), and real nix builds (marked ``nix``).

The nix tests build pulldown-cmark from Debian's offline registry against the
nixpkgs stand-in in tests/nixpkgs (``--override-input nixpkgs path:...``);
they need a root Nix set up by scripts/setup-nix.sh.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from flakebot_magic.backends.base import flake_meta
from flakebot_magic.errors import ConfigError, FlakeError
from flakebot_magic.registry.base import CrateCandidate
from flakebot_magic.sandbox.cargo import find_cargo
from flakebot_magic.stages.flake import (
    DEFAULT_NIXPKGS_URL,
    FlakeMeta,
    nix_string,
    render_flake,
    spdx_license_ids,
    write_flake,
)
from flakebot_magic.stages.fork import Workspace

REPO = Path(__file__).resolve().parents[2]
STAND_IN = REPO / "tests" / "nixpkgs"
REGISTRY = Path("/usr/share/cargo/registry")
CRATE = REGISTRY / "pulldown-cmark-0.9.2"

META = FlakeMeta(
    pname="pulldown-cmark",
    version="0.9.2",
    description="A pull parser for CommonMark",
    license="MIT",
    main_program="pulldown-cmark",
    homepage="https://github.com/raphlinus/pulldown-cmark",
)


# -- nix_string -----------------------------------------------------------

TRICKY_STRINGS = [
    "",
    "plain",
    'say "hi"',
    "back\\slash",
    '${builtins.abort "boom"}',
    "$${x}",
    "\\${x}",
    "$",
    "$$",
    "a$",
    "cost: $5 {not interpolated}",
    "line\nbreak\ttab\rcr",
    "''${x}'' and '' alone",
    "unicode: é ✓ 🦀",
]


@pytest.mark.parametrize(
    ("value", "literal"),
    [
        ("plain", '"plain"'),
        ('a "q"', '"a \\"q\\""'),
        ("a\\b", '"a\\\\b"'),
        ("${x}", '"\\${x}"'),
        ("$x {y}", '"$x {y}"'),
        ("$${x}", '"$\\${x}"'),
        ("a\nb\tc\rd", '"a\\nb\\tc\\rd"'),
        ("", '""'),
    ],
)
def test_nix_string_escapes(value: str, literal: str) -> None:
    assert nix_string(value) == literal


def test_nix_string_rejects_nul() -> None:
    with pytest.raises(ValueError, match="NUL"):
        nix_string("a\0b")


# -- SPDX -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "ids"),
    [
        ("MIT", ["MIT"]),
        ("", []),
        ("   ", []),
        ("MIT OR Apache-2.0", ["MIT", "Apache-2.0"]),
        ("MIT/Apache-2.0", ["MIT", "Apache-2.0"]),
        ("mit or apache-2.0", ["mit", "apache-2.0"]),
        ("(MIT OR Apache-2.0) AND Unicode-DFS-2016", ["MIT", "Apache-2.0", "Unicode-DFS-2016"]),
        ("Apache-2.0 WITH LLVM-exception OR MIT", ["Apache-2.0 WITH LLVM-exception", "MIT"]),
        ("GPL-2.0+", ["GPL-2.0-or-later"]),
        ("GPL-3.0", ["GPL-3.0-only"]),
        ("LGPL-2.1 OR AGPL-3.0+", ["LGPL-2.1-only", "AGPL-3.0-or-later"]),
        ("MIT OR MIT", ["MIT"]),
        ("Unlicense OR MIT", ["Unlicense", "MIT"]),
        ("WITH", []),
    ],
)
def test_spdx_license_ids(expression: str, ids: list[str]) -> None:
    assert spdx_license_ids(expression) == ids


# -- render_flake ---------------------------------------------------------


def test_render_flake_contents() -> None:
    text = render_flake(META)
    assert 'description = "A pull parser for CommonMark";' in text
    assert f"inputs.nixpkgs.url = {nix_string(DEFAULT_NIXPKGS_URL)};" in text
    assert 'systems = [ "x86_64-linux" "aarch64-linux" ];' in text
    assert "flake-utils" not in text
    assert "pkgs.rustPlatform.buildRustPackage" in text
    assert "cargoLock.lockFile = ./Cargo.lock;" in text
    assert "cargoHash" not in text and "cargoSha256" not in text
    assert 'pname = "pulldown-cmark";' in text
    assert 'version = "0.9.2";' in text
    assert 'mainProgram = "pulldown-cmark";' in text
    assert "inherit mainProgram;" in text
    assert 'homepage = "https://github.com/raphlinus/pulldown-cmark";' in text
    assert 'license = spdxLicense "MIT";' in text
    assert "lib.licenses" in text
    assert 'type = "app";' in text
    assert 'program = "${self.packages.${system}.default}/bin/${mainProgram}";' in text
    assert "pkgs.mkShell" in text
    assert "packages = [ pkgs.cargo pkgs.rustc pkgs.clippy pkgs.rust-analyzer ];" in text
    assert "default = package pkgs false;" in text  # packages
    assert "default = package pkgs true;" in text  # checks: doCheck
    # the lint cap reaches rustc and rustdoc in the derivation, its check phase too (issue 20)
    assert 'lintCap = "--cap-lints warn";' in text
    assert "RUSTFLAGS = lintCap;" in text and "RUSTDOCFLAGS = lintCap;" in text
    for output in ("packages", "checks", "apps", "devShells"):
        assert f"{output} = forAllSystems" in text


def test_render_flake_braces_balance() -> None:
    text = render_flake(META)
    assert text.count("{") == text.count("}")
    assert text.count("[") == text.count("]")
    assert text.count("(") == text.count(")")


def test_render_flake_custom_nixpkgs_url() -> None:
    text = render_flake(META, "github:NixOS/nixpkgs/nixos-unstable")
    assert 'inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";' in text


def test_render_flake_several_licenses() -> None:
    meta = FlakeMeta("x", "1.0.0", "d", "MIT OR Apache-2.0", "x")
    assert 'license = map spdxLicense [ "MIT" "Apache-2.0" ];' in render_flake(meta)


def test_render_flake_omits_empty_license_and_homepage() -> None:
    meta = FlakeMeta("x", "1.0.0", "d", "", "x")
    text = render_flake(meta)
    assert "license =" not in text
    assert "homepage =" not in text


def test_render_flake_escapes_hostile_metadata() -> None:
    evil = 'Evil "${builtins.abort "x"}" \\ tool'
    meta = FlakeMeta("x", "1.0.0", evil, "MIT", "x", homepage="https://e/${x}")
    text = render_flake(meta)
    assert nix_string(evil) in text
    assert "\\${builtins.abort" in text
    assert "${builtins.abort" not in text.replace("\\${", "")
    assert 'homepage = "https://e/\\${x}";' in text


def test_render_flake_description_is_one_line() -> None:
    meta = FlakeMeta("x", "1.0.0", "A tool\n  that spans\tlines ", "MIT", "x")
    assert 'description = "A tool that spans lines";' in render_flake(meta)


def test_render_flake_empty_description_falls_back() -> None:
    meta = FlakeMeta("x", "1.0.0", "", "MIT", "x")
    assert 'description = "x 1.0.0";' in render_flake(meta)


@pytest.mark.parametrize(
    "meta",
    [
        FlakeMeta("", "1.0.0", "d", "MIT", "x"),
        FlakeMeta("x", " ", "d", "MIT", "x"),
        FlakeMeta("x", "1.0.0", "d", "MIT", ""),
        FlakeMeta("x", "1.0.0", "d", "MIT", "../x"),
        FlakeMeta("x", "1.0.0", "d", "MIT", "a b"),
        # the plain-name rule deploy applies to every binary (diagnostics.BINARY_NAME)
        FlakeMeta("x", "1.0.0", "d", "MIT", "a.b"),
        FlakeMeta("x", "1.0.0", "d", "MIT", "a+b"),
        FlakeMeta("x", "1.0.0", "d", "MIT", "x\n"),
    ],
)
def test_render_flake_rejects_bad_meta(meta: FlakeMeta) -> None:
    with pytest.raises(FlakeError):
        render_flake(meta)


@pytest.mark.parametrize("bin_name", ["../../bin/sh", "a b", "x;y", "${x}", "x\n", ""])
def test_a_contracts_bin_is_checked_before_the_flake_is_written(tmp_path: Path, bin_name: str) -> None:
    """The tool contract's ``bin`` (a model may write it) must be a plain binary name to reach flake.nix."""
    crate = CrateCandidate("tinyecho", "0.2.0", has_bin=True, bin_names=("tinyecho",))
    (tmp_path / "Cargo.toml").write_text('[package]\nname = "tinyecho"\nversion = "0.2.0"\n')
    workspace = Workspace(tmp_path, crate, checksum="", checksum_kind="", published_commit="")
    assert flake_meta(workspace, "tinyecho").main_program == "tinyecho"
    with pytest.raises(FlakeError, match="plain binary name"):
        flake_meta(workspace, bin_name)


def test_write_flake(tmp_path: Path) -> None:
    assert write_flake(tmp_path, META) == ["flake.nix"]  # no Cargo.toml: no stub of its dependencies
    assert (tmp_path / "flake.nix").read_text() == render_flake(META)
    assert "deps = pkgs" not in render_flake(META)


def _crate(root: Path, manifest: str = '[dependencies]\nmemchr = "2"\n') -> Path:
    (root / "src").mkdir(parents=True)
    (root / "src" / "main.rs").write_text("fn main() {}")
    (root / "Cargo.toml").write_text('[package]\nname = "x"\nversion = "1.0.0"\nedition = "2021"\n' + manifest)
    (root / "Cargo.lock").write_text('version = 4\n\n[[package]]\nname = "x"\nversion = "1.0.0"\n')
    return root


def test_write_flake_writes_the_stub_the_dependencies_derivation_builds(tmp_path: Path) -> None:
    written = write_flake(_crate(tmp_path), META)
    assert written == [
        "flake.nix",
        "flakebot-deps/Cargo.lock",
        "flakebot-deps/Cargo.toml",
        "flakebot-deps/src/bin/0.rs",
    ]
    text = (tmp_path / "flake.nix").read_text()
    assert text == render_flake(META, deps=True)
    assert "deps = pkgs: doCheck:" in text and "deps = deps pkgs false;" in text
    assert "cp -r ${deps pkgs doCheck}/target target" in text, "the package starts from the dependencies' units"
    assert '"flakebot-deps"' in text.split("excluded = ")[1].split("\n")[0], "the stub is no part of the crate's src"
    manifest = (tmp_path / "flakebot-deps" / "Cargo.toml").read_text()
    assert manifest.startswith("# flakebot's stub") and 'name = "flakebot-deps"' in manifest and "memchr" in manifest
    # written again from a manifest with no stub (a path dependency): flakebot's old stub goes, and says so
    (tmp_path / "Cargo.toml").write_text((tmp_path / "Cargo.toml").read_text() + 'y = { path = "y" }\n')
    assert write_flake(tmp_path, META) == ["flake.nix", *written[1:]]
    assert not (tmp_path / "flakebot-deps").exists() and "deps = pkgs" not in (tmp_path / "flake.nix").read_text()


@pytest.mark.parametrize("kind", ["the crate's own directory", "a link", "a file"])
def test_a_flakebot_deps_that_is_not_flakebots_is_left_alone(tmp_path: Path, kind: str) -> None:
    _crate(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    deps = tmp_path / "flakebot-deps"
    if kind == "a link":
        deps.symlink_to(outside)
    elif kind == "a file":
        deps.write_text("the crate's")
    else:
        deps.mkdir()
        (deps / "Cargo.toml").write_text("[package]\nname = 'its own'\n")
    assert write_flake(tmp_path, META) == ["flake.nix"]
    assert "deps = pkgs" not in (tmp_path / "flake.nix").read_text()
    assert list(outside.iterdir()) == [] and os.path.lexists(deps)


# -- real nix -------------------------------------------------------------

NIX = shutil.which("nix")
OVERRIDE = ["--override-input", "nixpkgs", f"path:{STAND_IN}"]
NIX_FLAGS = ["--extra-experimental-features", "nix-command flakes"]
SYSTEM = f"{platform.machine()}-linux"


def _nix_setup_problem() -> str | None:
    if NIX is None:
        return "nix is not installed (run scripts/setup-nix.sh as root)"
    try:
        out = subprocess.run(
            [NIX, *NIX_FLAGS, "show-config"], capture_output=True, text=True, timeout=60, check=True
        ).stdout
    except (subprocess.SubprocessError, OSError) as exc:
        return f"nix does not work here: {exc}"
    config: dict[str, str] = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        config[key.strip()] = value.strip()
    if config.get("sandbox", "") != "true":
        return "nix's sandbox is off; flakebot builds only in it (run scripts/setup-nix.sh)"
    if "/opt/host-rust=" not in config.get("sandbox-paths", "") and not Path("/usr/bin/cargo").exists():
        return "the stand-in finds no Rust toolchain in nix's sandbox (run scripts/setup-nix.sh)"
    return None


def _nix(*args: str, cwd: Path, timeout: float = 900, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    assert NIX is not None
    done = subprocess.run(
        [NIX, *NIX_FLAGS, *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"nix {' '.join(args)} failed:\n{done.stderr[-4000:]}"
    return done


@pytest.fixture(scope="module")
def nix_ready() -> None:
    problem = _nix_setup_problem()
    if problem:
        pytest.skip(problem)


def _git_track(path: Path) -> None:
    subprocess.run(["git", "init", "-q"], cwd=path, check=True)
    subprocess.run(["git", "add", "-A"], cwd=path, check=True)


def _drop_dev_dependencies(manifest: Path) -> None:
    kept: list[str] = []
    skipping = False
    for line in manifest.read_text().splitlines():
        if line.startswith("["):
            skipping = bool(re.match(r"\[(target\..*\.)?dev-dependencies", line))
        if not skipping:
            kept.append(line)
    manifest.write_text("\n".join(kept) + "\n")


@pytest.fixture(scope="module")
def built_workspace(nix_ready: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pulldown-cmark forked, locked offline, flaked, and `nix build` run once."""
    if not CRATE.is_dir():
        pytest.skip(f"{CRATE} is missing (apt-get install librust-pulldown-cmark-dev)")
    try:
        cargo = find_cargo()
    except ConfigError:
        pytest.skip("cargo is not installed")
    workspace = tmp_path_factory.mktemp("flake") / "pulldown-cmark"
    shutil.copytree(CRATE, workspace)
    _drop_dev_dependencies(workspace / "Cargo.toml")
    shutil.rmtree(workspace / "tests")  # integration tests need the dropped dev-dependencies
    (workspace / ".cargo").mkdir()
    (workspace / ".cargo" / "config.toml").write_text(
        f'[source.crates-io]\nreplace-with = "deb"\n\n[source.deb]\ndirectory = "{REGISTRY}"\n'
    )
    subprocess.run(
        [cargo, "generate-lockfile", "--offline"], cwd=workspace, check=True, capture_output=True, timeout=300
    )
    write_flake(workspace, META)
    _git_track(workspace)
    _nix("build", *OVERRIDE, cwd=workspace)
    return workspace


@pytest.mark.nix
def test_nix_string_round_trips_through_nix(nix_ready: None, tmp_path: Path) -> None:
    expr = "[ " + " ".join(nix_string(s) for s in TRICKY_STRINGS) + " ]"
    done = _nix("eval", "--json", "--expr", expr, cwd=tmp_path, timeout=120)
    assert json.loads(done.stdout) == TRICKY_STRINGS


@pytest.mark.nix
def test_licenses_map_to_lib_licenses(nix_ready: None, tmp_path: Path) -> None:
    meta = FlakeMeta("x", "1.0.0", "d", "(MIT OR apache-2.0) AND LicenseRef-Odd", "x")
    write_flake(tmp_path, meta)
    (tmp_path / "Cargo.lock").write_text("")
    _git_track(tmp_path)
    done = _nix("eval", "--json", *OVERRIDE, f".#packages.{SYSTEM}.default.meta.license", cwd=tmp_path, timeout=120)
    licenses = json.loads(done.stdout)
    assert [(lic.get("shortName"), lic["spdxId"], lic["free"]) for lic in licenses] == [
        ("mit", "MIT", True),
        ("asl20", "Apache-2.0", True),
        ("LicenseRef-Odd", "LicenseRef-Odd", True),  # unknown: a plain record, no error
    ]


@pytest.mark.nix
def test_nix_build_renders_markdown(built_workspace: Path) -> None:
    binary = built_workspace / "result" / "bin" / "pulldown-cmark"
    done = subprocess.run([str(binary)], input="# Hi", capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout == "<h1>Hi</h1>\n"


@pytest.mark.nix
def test_nix_run(built_workspace: Path) -> None:
    done = _nix("run", *OVERRIDE, ".", cwd=built_workspace, stdin="# Hi", timeout=300)
    assert done.stdout == "<h1>Hi</h1>\n"


@pytest.mark.nix
def test_nix_flake_check_runs_the_tests(built_workspace: Path) -> None:
    _nix("flake", "check", *OVERRIDE, cwd=built_workspace)
    drv = _nix(
        "eval", "--raw", *OVERRIDE, f".#checks.{SYSTEM}.default.drvPath", cwd=built_workspace, timeout=120
    ).stdout
    log = _nix("log", drv, cwd=built_workspace, timeout=60).stdout
    assert re.search(r"test result: .*ok.*\. [1-9]\d* passed; 0 failed", log), log[-3000:]


@pytest.mark.nix
def test_nix_build_is_reproducible(built_workspace: Path) -> None:
    # --rebuild builds again and fails if the output differs bit for bit
    done = _nix("build", *OVERRIDE, "--rebuild", cwd=built_workspace)
    assert "may not be deterministic" not in done.stderr
    binary = (built_workspace / "result" / "bin" / "pulldown-cmark").read_bytes()
    for host_path in (b"/tmp/nix-build-", b"/usr/share/cargo/registry", str(built_workspace).encode()):
        assert host_path not in binary, f"{host_path!r} leaked into the binary"


@pytest.mark.nix
def test_nix_develop_shell_has_the_toolchain(built_workspace: Path) -> None:
    done = _nix("develop", *OVERRIDE, "-c", "cargo", "--version", cwd=built_workspace, timeout=300)
    assert done.stdout.startswith("cargo ")


#: a crate that denies warnings and holds what today's rustc warns about, with a doc test (qrcode's case)
_DENIES_WARNINGS = {
    "Cargo.toml": '[package]\nname = "capped"\nversion = "0.1.0"\nedition = "2021"\n',
    "src/lib.rs": "#![deny(warnings)]\n/// ```\n/// assert_eq!(capped::one(), 1);\n/// ```\n"
    "pub fn one() -> u32 {\n    let one = (1); // unnecessary parentheses: a warning today\n    one\n}\n",
    "src/main.rs": 'fn main() {\n    println!("{}", capped::one());\n}\n',
    "Cargo.lock": '# This file is automatically @generated by Cargo.\nversion = 3\n\n[[package]]\nname = "capped"\n'
    'version = "0.1.0"\n',
}


@pytest.mark.nix
def test_the_lint_cap_reaches_the_nix_build_and_its_check_phase(nix_ready: None, tmp_path: Path) -> None:
    workspace = tmp_path / "capped"
    for name, text in _DENIES_WARNINGS.items():
        (workspace / name).parent.mkdir(parents=True, exist_ok=True)
        (workspace / name).write_text(text)
    write_flake(workspace, FlakeMeta("capped", "0.1.0", "one", "MIT", "capped"), f"path:{STAND_IN}")
    _git_track(workspace)
    _nix("flake", "check", *OVERRIDE, cwd=workspace)  # rustc and rustdoc (the doc test) under deny(warnings)
    drv = _nix("eval", "--raw", *OVERRIDE, f".#checks.{SYSTEM}.default.drvPath", cwd=workspace, timeout=120).stdout
    log = re.sub(r"\x1b(\[[0-9;]*m|\(B)", "", _nix("log", drv, cwd=workspace, timeout=60).stdout)
    assert "warning: unnecessary parentheses" in log
    # rustdoc compiled the crate for its doc tests: the same lint, capped to a warning, then the doc test ran
    assert re.search(r"Doc-tests capped\s+warning: unnecessary parentheses.*?running 1 test", log, re.S), log[-3000:]
    assert re.search(r"test result: ok\. 1 passed; 0 failed", log), log[-3000:]


# -- what Nix would fetch on the host while it reads the flake ---------------------------------

_ROOT = '[[package]]\nname = "tool"\nversion = "0.1.0"\n'
_REGISTRY = '[[package]]\nname = "memchr"\nversion = "2.7.1"\nsource = "registry+https://github.com/rust-lang/crates.io-index"\n'


@pytest.mark.parametrize(
    "source",
    [
        "git+file:///root/secret-repo#0123456789abcdef",
        "git+https://example.com/x.git?rev=1#0123",
        "git+ssh://git@example.com/x.git#0123",
        "path+file:///etc",
        "sparse+https://index.example/",  # another registry protocol: not what the flake's lock reads
        "",
        "REGISTRY+https://x",
    ],
)
def test_a_lock_naming_a_package_nix_would_fetch_on_the_host_is_refused(tmp_path: Path, source: str) -> None:
    from flakebot_magic.stages.flake import check_lock_sources

    lock = f'version = 3\n{_ROOT}{_REGISTRY}[[package]]\nname = "evil"\nversion = "1.0.0"\nsource = "{source}"\n'
    (tmp_path / "Cargo.lock").write_text(lock)
    with pytest.raises(FlakeError, match="Nix would fetch it on this machine"):
        check_lock_sources(tmp_path)
    (tmp_path / "Cargo.lock").write_text("")  # the bytes at a commit are what is checked, when given
    with pytest.raises(FlakeError, match="'evil'"):
        check_lock_sources(tmp_path, lock.encode())


def test_a_lock_of_registry_packages_and_the_crate_itself_passes(tmp_path: Path) -> None:
    from flakebot_magic.stages.flake import check_lock_sources

    (tmp_path / "Cargo.lock").write_text(f"version = 3\n{_ROOT}{_REGISTRY}")
    check_lock_sources(tmp_path)
    check_lock_sources(tmp_path / "none")  # no lock: nothing to fetch
    (tmp_path / "Cargo.lock").write_text("[[package]\n")
    with pytest.raises(FlakeError, match="cannot read"):
        check_lock_sources(tmp_path)


def test_every_door_that_has_nix_read_a_workspace_flake_checks_its_lock() -> None:
    """The nix backend's build and verify's rebuild from a commit: both call the check before nix evaluates."""
    import inspect

    from flakebot_magic.backends import nix
    from flakebot_magic.manage import verify

    build = inspect.getsource(nix.NixBackend.build)
    assert build.index("check_lock_sources(") < build.index("write_flake(")
    source = inspect.getsource(verify.rebuild_source)
    assert source.index("check_lock_sources(") < source.index('f"git+file://')
