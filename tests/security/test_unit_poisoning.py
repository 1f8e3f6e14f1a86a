"""Poisoning the dependency cache: every writer that can run tries to rewrite a cached unit; a later tool links the
sealed bytes.

The invariant (docs/dependency-cache.md, "The rule"): a unit a later build uses was written only by code that
build runs anyway. Each case builds tool A, whose build runs one writer that rewrites the shared crate
``victim``'s compiled unit in place (its greeting's bytes, same length, so the rlib still links), and then tool
B, which shares ``victim`` with A and nothing else. B must print the clean greeting and pass its test (which
checks the greeting in the debug unit), and every sealed unit must still be the bytes that were sealed.

The writers: a dependency's build script and a proc macro (both run in A's stub build, where the units are
compiled and sealed), and A's own build script, tests and doc tests (which run in A's own builds, against the
copies). Each is run in each mode that matters: ``confined`` (Landlock: the write fails), ``per-build`` (the
unit is sealed naming its possible writers, and B, which lacks them, compiles its own), and with the seal
turned off (the TEST HOOK ``FLAKEBOT_UNITS_NAIVE``: no confinement, units hard-linked, no hash check), where
each attack must succeed: those cases are strict xfails, so an attack that stops working fails the suite.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tinycrates import crate, write_registry

import flakebot_magic
from flakebot_magic.clients import ToolClient
from flakebot_magic.errors import TestError
from flakebot_magic.records.units import NAIVE_HOOK, UnitStore
from flakebot_magic.sandbox import bubblewrap_works, unit_wrapper
from flakebot_magic.stages.deps import MODE_HOOK, wait_for_fills

pytestmark = [
    pytest.mark.cargo,
    pytest.mark.timeout(900),
    pytest.mark.skipif(bool(bubblewrap_works()), reason=f"no working bubblewrap: {bubblewrap_works()}"),
]

CLEAN = "victim-says-clean-0001"
EVIL = "victim-says-EVIL!-0001"

#: rewrites every ``libvictim-*`` rlib and rmeta in ``deps`` in place (made writable first: a hard link into a
#: read-only store is written through); how many it rewrote
POISON = r"""
pub fn poison(deps: &std::path::Path) -> usize {
    let clean: &[u8] = b"victim-says-clean-0001";
    let evil: &[u8] = b"victim-says-EVIL!-0001";
    let mut rewritten = 0;
    let entries = match std::fs::read_dir(deps) { Ok(e) => e, Err(_) => return 0 };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if !name.starts_with("libvictim-") || !(name.ends_with(".rlib") || name.ends_with(".rmeta")) {
            continue;
        }
        let path = entry.path();
        if let Ok(meta) = std::fs::metadata(&path) {
            let mut permissions = meta.permissions();
            #[allow(clippy::permissions_set_readonly_false)]
            permissions.set_readonly(false);
            let _ = std::fs::set_permissions(&path, permissions);
        }
        let mut bytes = match std::fs::read(&path) { Ok(b) => b, Err(_) => continue };
        let mut changed = false;
        let mut i = 0;
        while i + clean.len() <= bytes.len() {
            if &bytes[i..i + clean.len()] == clean {
                bytes[i..i + clean.len()].copy_from_slice(evil);
                changed = true;
                i += clean.len();
            } else {
                i += 1;
            }
        }
        if changed {
            use std::io::Write;
            if let Ok(mut file) = std::fs::OpenOptions::new().write(true).open(&path) {
                if file.write_all(&bytes).is_ok() {
                    rewritten += 1;
                }
            }
        }
    }
    rewritten
}

/// Wait (at most a minute) for the victim's rlib to be in ``deps``: in a stub build it compiles beside the writer.
pub fn when_built(deps: &std::path::Path) {
    for _ in 0..240 {
        let found = std::fs::read_dir(deps).map(|entries| {
            entries.flatten().any(|e| {
                let name = e.file_name().to_string_lossy().to_string();
                name.starts_with("libvictim-") && name.ends_with(".rlib")
            })
        });
        if found.unwrap_or(false) {
            std::thread::sleep(std::time::Duration::from_millis(300));
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}
"""

#: the deps dir of a build script's target: OUT_DIR is PROFILE/build/PKG-HASH/out
FROM_OUT_DIR = 'std::path::Path::new(&std::env::var("OUT_DIR").unwrap()).join("../../../deps")'


def _lib(
    name: str, version: str = "1.0.0", deps: str = "", files: dict[str, str] | None = None, extra: str = ""
) -> object:
    manifest = f'[package]\nname = "{name}"\nversion = "{version}"\nedition = "2021"\nlicense = "MIT"\n'
    manifest += f'description = "{name}"\n{extra}\n[dependencies]\n{deps}'
    return crate(name, version, manifest=manifest, files=files or {"src/lib.rs": ""})


def _tool(name: str, deps: str, files: dict[str, str]) -> object:
    main = 'fn main() {\n    println!("{}", victim::greet());\n}\n'
    return _lib(name, "0.1.0", 'victim = "1"\n' + deps, {"src/main.rs": main, **files})


VICTIM = _lib(
    "victim", files={"src/lib.rs": f'#[inline(never)]\npub fn greet() -> &\'static str {{\n    "{CLEAN}"\n}}\n'}
)
EVIL_BUILD = _lib(
    "evil-build",
    files={
        "src/lib.rs": "",
        "build.rs": POISON + f"fn main() {{\n    let deps = {FROM_OUT_DIR};\n    when_built(&deps);\n"
        '    let said = format!("evil-build rewrote {} victim files", poison(&deps));\n'
        '    std::fs::write(std::path::Path::new(&std::env::var("OUT_DIR").unwrap()).join("attempt.txt"), said).unwrap();\n}\n',
    },
)
EVIL_MACRO = _lib(
    "evil-macro",
    files={
        "src/lib.rs": "extern crate proc_macro;\n"
        + POISON.replace("pub fn", "fn")
        + "fn deps() -> std::path::PathBuf {\n"
        '    let cmdline = std::fs::read("/proc/self/cmdline").unwrap_or_default();\n'
        "    for arg in cmdline.split(|b| *b == 0) {\n"
        "        let arg = String::from_utf8_lossy(arg);\n"
        '        if let Some(path) = arg.strip_prefix("dependency=") { return path.into(); }\n'
        "    }\n"
        '    std::path::PathBuf::from("/nonexistent")\n}\n'
        "#[proc_macro]\npub fn attack(_: proc_macro::TokenStream) -> proc_macro::TokenStream {\n"
        "    let deps = deps();\n    when_built(&deps);\n"
        # what it did, compiled into the crate using it (so into that crate's sealed unit: it can write nowhere)
        '    format!("pub static EVIL_MACRO_SAID: &str = \\"evil-macro rewrote {} victim files\\";", poison(&deps))\n'
        "        .parse().unwrap()\n}\n",
    },
    extra="[lib]\nproc-macro = true\n",
)
MACRO_USER = _lib(
    "macro-user",
    deps='victim = "1"\nevil-macro = "1"\n',
    files={"src/lib.rs": "evil_macro::attack!();\npub fn uses() -> &'static str { victim::greet() }\n"},
)
TOOL_B = _tool(
    "tool-b",
    "",
    {"tests/clean.rs": f'#[test]\nfn greeting_is_clean() {{\n    assert_eq!(victim::greet(), "{CLEAN}");\n}}\n'},
)
#: a tool with the same dependencies as B (victim alone), built before A when A's own code attacks: A's builds then
#: start from victim's sealed units, and rewrite their copies
SEED = _tool("tool-seed", "", {})

#: tool A for each writer: what it depends on and the files that carry the attack
WRITERS: dict[str, object] = {
    "dependency-build-script": _tool("tool-a", 'evil-build = "1"\n', {}),
    "proc-macro": _tool("tool-a", 'macro-user = "1"\n', {}),
    "own-build-script": _tool(
        "tool-a",
        "",
        {
            "build.rs": POISON + f"fn main() {{\n    let n = poison(&{FROM_OUT_DIR});\n"
            '    println!("cargo:warning=tool-a rewrote {} victim files", n);\n}\n'
        },
    ),
    "tests": _tool(
        "tool-a",
        "",
        {
            "tests/attack.rs": POISON + "#[test]\nfn attack() {\n"
            "    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();\n"
            '    eprintln!("the test rewrote {} victim files", poison(&deps));\n}\n'
        },
    ),
    "doc-tests": _tool(
        "tool-a",
        "",
        {
            "src/lib.rs": POISON.replace("pub fn when_built", "fn _when_built")
            + "/// ```\n/// tool_a::attack();\n/// ```\npub fn attack() {\n"
            '    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_default();\n'
            '    eprintln!("the doc test rewrote {} files", poison(&std::path::Path::new(&target).join("debug/deps")));\n}\n'
        },
    ),
}


def _build(root: Path, cache: Path, crate_name: str, name: str) -> ToolClient:
    """The tool, built; and the stub builds sealing the dependencies it compiled itself (the first's) over."""
    tool = flakebot_magic.build(
        crate=crate_name, name=name, registry=str(root), cache_dir=cache, backend="cargo", keep_workspace=True
    )
    assert wait_for_fills(600)
    return tool


def _sealed(cache: Path, package: str) -> list[bytes]:
    """The bytes of every file sealed for ``package`` (``name version``)."""
    store = UnitStore(cache / "units")
    records = [r for _, r in store.records() if r is not None and r.package == package]
    return [store._object(f.sha256).read_bytes() for r in records for f in r.files]


def _attempts(cache: Path, writer: str) -> list[int]:
    """How many victim files each run of the writer rewrote where it ran (the attack did run: never vacuous)."""
    if writer == "dependency-build-script":  # it says so in its OUT_DIR, sealed with its unit by the stub build
        said = [data.decode() for data in _sealed(cache, "evil-build 1.0.0") if data.startswith(b"evil-build")]
    elif writer == "proc-macro":  # what it expanded to, in the sealed unit of the crate using it
        said = re.findall(
            r"evil-macro rewrote \d+ victim files", b"".join(_sealed(cache, "macro-user 1.0.0")).decode("latin-1")
        )
    else:  # A's own code rewrote A's own copies: that is its own power, and they show it
        deps = cache / "workspaces" / "a" / "target" / "flakebot-test" / "debug" / "deps"
        said = [f"rewrote {int(EVIL.encode() in p.read_bytes())}" for p in deps.glob("libvictim-*.r*")]
    return [int(line.split("rewrote ")[1].split()[0]) for line in said]


def _attack_then_share(tmp_path: Path, writer: str, *, confined: bool = False) -> None:
    """Build A (its writer attacks ``victim``), then B; B must link the sealed, clean bytes.

    A dependency's writer runs where victim is compiled and sealed: the stub build that follows A's own build
    (A compiled its dependencies itself, none being sealed yet). A's own code runs against copies: a tool with
    B's dependencies (the seed) is built first, so that A's builds start from victim's sealed units.
    """
    crates = [VICTIM, EVIL_BUILD, EVIL_MACRO, MACRO_USER, WRITERS[writer], TOOL_B, SEED]
    root = write_registry(tmp_path / "registry", crates)
    cache = tmp_path / "cache"
    own = writer not in ("dependency-build-script", "proc-macro")
    if own:
        _build(root, cache, "tool-seed", "seed")
    _build(root, cache, "tool-a", "a")
    # the attack ran (pytest.fail, not an assertion: the naive cases' xfail expects only B's failure)
    attempts = _attempts(cache, writer)
    if not attempts:
        pytest.fail(f"the {writer} never ran its attack")
    if not own:
        # confined, its writes fail; otherwise they succeed in the stub (per-build: the unit names its writers)
        if (max(attempts) == 0) != confined:
            pytest.fail(f"the {writer} rewrote {attempts} files")
    elif max(attempts) == 0:
        pytest.fail(f"the {writer} could not even rewrite A's own copies")
    b = _build(root, cache, "tool-b", "b")
    assert b().strip() == CLEAN, f"tool B linked a rewritten victim: it printed {b()!r}"
    release = cache / "workspaces" / ".sandbox" / "b" / "release-target" / "release" / "deps"
    for rlib in release.glob("libvictim-*.rlib"):
        data = rlib.read_bytes()
        assert CLEAN.encode() in data and EVIL.encode() not in data, f"{rlib} is not victim's clean unit"
    assert UnitStore(cache / "units").check(full=True) == [], "a sealed unit differs from what was sealed"


#: the modes each writer is run in: a writer of the stub build meets the confinement or the per-build rule; the
#: crate's own code runs after the seal, against copies, in either mode
CASES = [
    *(pytest.param(w, "confined", id=f"{w}-confined") for w in WRITERS),
    pytest.param("dependency-build-script", "per-build", id="dependency-build-script-per-build"),
    pytest.param("proc-macro", "per-build", id="proc-macro-per-build"),
    pytest.param("own-build-script", "per-build", id="own-build-script-per-build"),
]


@pytest.mark.parametrize(("writer", "mode"), CASES)
def test_a_later_tool_links_the_sealed_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writer: str, mode: str
) -> None:
    if mode == "confined" and unit_wrapper.landlock_abi() < 1:
        pytest.skip("no Landlock in this kernel: the per-build cases cover it")
    monkeypatch.setenv(MODE_HOOK, "per-build" if mode == "per-build" else "")
    _attack_then_share(tmp_path, writer, confined=mode == "confined")


@pytest.mark.xfail(
    strict=True, raises=(AssertionError, TestError), reason="the seal off (TEST HOOK): each attack gets through"
)
@pytest.mark.parametrize("writer", list(WRITERS))
def test_the_attacks_work_when_sharing_is_naive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writer: str) -> None:
    monkeypatch.setenv(NAIVE_HOOK, "1")
    _attack_then_share(tmp_path, writer)
