"""Wrong keys are misses, never wrong binaries: real builds through the pipeline that share a dependency with a
tool built before, but not its unit.

Each case builds tool ``first``, then tool ``second`` whose shared dependency ``victim`` must compile differently:
other features, another profile, another toolchain (a wrapper rustc whose ``-vV`` differs), the registry
moved, the registry's files of ``victim`` changed at the same path and version (where cargo alone would reuse
the unit: it never rereads a registry package's files). ``second`` must print what its own inputs make, and its
stub must have compiled ``victim`` again.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from tinycrates import crate, write_registry

import flakebot_magic
from flakebot_magic.clients import ToolClient
from flakebot_magic.records.units import UnitStore
from flakebot_magic.sandbox import bubblewrap_works
from flakebot_magic.stages.deps import wait_for_fills

pytestmark = [
    pytest.mark.cargo,
    pytest.mark.timeout(900),
    pytest.mark.skipif(bool(bubblewrap_works()), reason=f"no working bubblewrap: {bubblewrap_works()}"),
]

VICTIM_LIB = """
pub fn greet() -> String {
    let mut said = String::from("plain");
    if cfg!(feature = "loud") { said = said.to_uppercase(); }
    if cfg!(debug_assertions) { said.push_str("+checked"); }
    said
}
"""


def _victim(body: str = VICTIM_LIB) -> object:
    manifest = (
        '[package]\nname = "victim"\nversion = "1.0.0"\nedition = "2021"\nlicense = "MIT"\ndescription = "v"\n'
        "[features]\nloud = []\n"
    )
    return crate("victim", "1.0.0", manifest=manifest, files={"src/lib.rs": body})


def _tool(name: str, victim: str = '"1"', extra: str = "") -> object:
    manifest = (
        f'[package]\nname = "{name}"\nversion = "0.1.0"\nedition = "2021"\nlicense = "MIT"\ndescription = "t"\n'
        f"[dependencies]\nvictim = {victim}\n{extra}"
    )
    main = 'fn main() {\n    println!("{}", victim::greet());\n}\n'
    return crate(name, "0.1.0", manifest=manifest, files={"src/main.rs": main})


def _build(registry: Path, cache: Path, name: str) -> ToolClient:
    """The tool ``name``, built; and the stub builds it started (a first tool's dependencies) over."""
    tool = flakebot_magic.build(
        crate=name, name=name.replace("-", "_"), registry=str(registry), cache_dir=cache, backend="cargo"
    )
    assert wait_for_fills(600)
    return tool


def _victim_units(cache: Path) -> set[tuple[str, str]]:
    """(key, cargo's unit name) of every sealed unit of ``victim``."""
    return {
        (r.key, r.unit)
        for _, r in UnitStore(cache / "units").records()
        if r is not None and r.package == "victim 1.0.0"
    }


def _compiled_victim(cache: Path, name: str) -> bool:
    """Did the tool's stub builds compile ``victim`` (rather than take it from the cache)?"""
    log = (cache / "logs" / f"{name}.log").read_text()
    return "Compiling victim v1.0.0" in log


@pytest.mark.parametrize(
    ("second", "expected"),
    [
        pytest.param(_tool("second", '{ version = "1", features = ["loud"] }'), "PLAIN", id="other-features"),
        pytest.param(
            _tool("second", extra="[profile.release]\ndebug-assertions = true\n"), "plain+checked", id="other-profile"
        ),
    ],
)
def test_other_features_or_profile_are_units_of_their_own(tmp_path: Path, second: object, expected: str) -> None:
    registry = write_registry(tmp_path / "registry", [_victim(), _tool("first"), second])
    cache = tmp_path / "cache"
    assert _build(registry, cache, "first")().strip() == "plain"
    assert _build(registry, cache, "second")().strip() == expected
    assert _compiled_victim(cache, "second")
    keys = {key for key, _ in _victim_units(cache)}
    units = {unit for _, unit in _victim_units(cache)}
    assert len(keys) == 2 and len(units) >= 3, "the same key (release and test), cargo's unit names differ"


def test_the_same_dependencies_again_compile_nothing(tmp_path: Path) -> None:
    """The control: what the cases below change is all that makes them miss."""
    registry = write_registry(tmp_path / "registry", [_victim(), _tool("first"), _tool("second")])
    cache = tmp_path / "cache"
    _build(registry, cache, "first")
    assert _build(registry, cache, "second")().strip() == "plain"
    assert not _compiled_victim(cache, "second")


def test_another_toolchain_misses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    registry = write_registry(tmp_path / "registry", [_victim(), _tool("first"), _tool("second")])
    cache = tmp_path / "cache"
    _build(registry, cache, "first")
    # the toolchain as hard links (visible in the sandbox at its own path, no bytes copied), its rustc wrapped
    sysroot = Path(
        subprocess.run(["rustc", "--print", "sysroot"], capture_output=True, text=True, check=True).stdout.strip()
    )
    toolchain = tmp_path / "toolchain"
    subprocess.run(["cp", "-al", str(sysroot), str(toolchain)], check=True)
    rustc = toolchain / "bin" / "rustc"
    rustc.rename(toolchain / "bin" / "rustc.real")
    rustc.write_text(
        '#!/bin/sh\nreal="$(dirname "$0")/rustc.real"\n'
        'if [ "$1" = "-vV" ]; then "$real" -vV; echo "flakebot-test: wrapped"; exit; fi\nexec "$real" "$@"\n'
    )
    rustc.chmod(0o755)
    wrapped = toolchain / "bin"
    monkeypatch.setenv("PATH", f"{wrapped}:{os.environ['PATH']}")
    assert _build(registry, cache, "second")().strip() == "plain"
    assert _compiled_victim(cache, "second")
    assert len({key for key, _ in _victim_units(cache)}) == 4, "release and test units under each toolchain's key"


def test_a_moved_registry_misses(tmp_path: Path) -> None:
    registry = write_registry(tmp_path / "registry", [_victim(), _tool("first"), _tool("second")])
    cache = tmp_path / "cache"
    _build(registry, cache, "first")
    moved = tmp_path / "moved"
    shutil.copytree(registry, moved)
    assert _build(moved, cache, "second")().strip() == "plain"
    assert _compiled_victim(cache, "second")


def test_changed_files_at_the_same_path_and_version_miss(tmp_path: Path) -> None:
    """Cargo alone would reuse this unit (a registry package's fingerprint is its version); the key has its files."""
    registry = write_registry(tmp_path / "registry", [_victim(), _tool("first"), _tool("second")])
    cache = tmp_path / "cache"
    _build(registry, cache, "first")
    (registry / "victim-1.0.0" / "src" / "lib.rs").write_text(VICTIM_LIB.replace('"plain"', '"fresh"'))
    assert _build(registry, cache, "second")().strip() == "fresh"
    assert _compiled_victim(cache, "second")


def test_two_builds_of_the_same_dependencies_at_once_compile_them_once(tmp_path: Path) -> None:
    """Two tools with the same dependencies built at the same time: one stub build per set, the other waits and
    copies (they have one stub: the stub's name is no crate's)."""
    slow = crate(  # its build script takes 4 s: the two stub builds would overlap
        "victim",
        "1.0.0",
        manifest='[package]\nname = "victim"\nversion = "1.0.0"\nedition = "2021"\nlicense = "MIT"\ndescription = "v"\n'
        "[features]\nloud = []\n",
        files={
            "src/lib.rs": VICTIM_LIB,
            "build.rs": "fn main() { std::thread::sleep(std::time::Duration::from_secs(4)); }",
        },
    )
    registry = write_registry(tmp_path / "registry", [slow, _tool("first"), _tool("second"), _tool("third")])
    cache = tmp_path / "cache"
    _build(registry, cache, "first")  # the index and the probes, so both start alike; its units are then cleared
    shutil.rmtree(cache / "units")
    outcomes: dict[str, str] = {}

    def build(name: str) -> None:
        outcomes[name] = flakebot_magic.build(crate=name, name=name, registry=str(registry), cache_dir=cache)().strip()

    threads = [threading.Thread(target=build, args=(name,)) for name in ("second", "third")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wait_for_fills(600)
    assert outcomes == {"second": "plain", "third": "plain"}
    # both compiled victim in their own builds (none was sealed yet); the stub sealed it once per set after them
    said = "\n".join(log.read_text() for log in (cache / "units" / "stubs").glob("*.log"))
    assert said.count("Compiling victim v1.0.0") == 2, f"one stub build per set (release, test), not per tool:\n{said}"
