"""The dependency cache's parts: the stub, the keys, the unit store (seal, copy by hash, never through a link).

Real builds that show a wrong key is a miss, never a wrong binary, are in ``test_deps_keys.py``; the poisoning
attacks in ``tests/security/test_unit_poisoning.py``.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import tomllib

from flakebot_magic.events import EventBus
from flakebot_magic.records.units import UnitRecord, UnitStore
from flakebot_magic.sandbox.stub import Stub, lock_packages, stub_of
from flakebot_magic.stages.deps import DependencyCache, DepsBuild, Plan

LOCK = b"""version = 4

[[package]]
name = "a"
version = "1.0.0"
source = "registry+https://github.com/rust-lang/crates.io-index"
checksum = "x"
dependencies = ["b", "c 2.0.0"]

[[package]]
name = "b"
version = "1.0.0"
source = "registry+https://github.com/rust-lang/crates.io-index"

[[package]]
name = "c"
version = "1.0.0"
source = "registry+https://github.com/rust-lang/crates.io-index"

[[package]]
name = "c"
version = "2.0.0"
source = "registry+https://github.com/rust-lang/crates.io-index"

[[package]]
name = "tool"
version = "0.1.0"
dependencies = ["a"]
"""


def _workspace(tmp_path: Path, manifest: str, files: dict[str, str] | None = None) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir(parents=True)
    (ws / "Cargo.toml").write_text('[package]\nname = "tool"\nversion = "0.1.0"\nedition = "2021"\n' + manifest)
    (ws / "Cargo.lock").write_bytes(LOCK)
    for rel, text in (files or {"src/main.rs": "fn main() {}"}).items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text)
    return ws


def _manifest(ws: Path) -> dict[str, object]:
    stub = stub_of(ws)
    assert not isinstance(stub, str), stub
    return tomllib.loads(stub.files["Cargo.toml"].decode())


# -- the stub --------------------------------------------------------------------------------------------------


def test_the_stub_asks_for_what_the_crate_asks_for_and_holds_none_of_its_code(tmp_path: Path) -> None:
    ws = _workspace(
        tmp_path,
        '[dependencies]\na = { version = "1", features = ["x"] }\n[dev-dependencies]\nb = "1"\n'
        '[build-dependencies]\nc = "1"\n[features]\ndefault = ["a/y"]\n[profile.release]\nlto = true\n'
        '[target."cfg(unix)".dependencies]\nb = "1"\n[[bin]]\nname = "other"\npath = "src/other.rs"\n'
        'required-features = ["default"]\n',
        {
            "src/main.rs": "fn main() { evil() }",
            "src/lib.rs": "pub fn evil() {}",
            "src/other.rs": "fn main() {}",
            "build.rs": "fn main() { std::process::exit(1) }",
        },
    )
    doc = _manifest(ws)
    original = tomllib.loads((ws / "Cargo.toml").read_text())
    for table in ("dependencies", "dev-dependencies", "build-dependencies", "features", "profile", "target"):
        assert doc[table] == original[table], table
    # under a name of no crate: two crates asking for the same dependencies have the same stub
    assert doc["package"]["name"] == "flakebot-deps" and doc["package"]["version"] == "0.0.0"  # type: ignore[index]
    bins = [b.get("required-features") for b in doc["bin"]]  # type: ignore[union-attr]
    assert sorted(map(str, bins)) == ["None", "['default']"], "a bin for each of the crate's, as it requires"
    stub = stub_of(ws)
    assert not isinstance(stub, str)
    code = {p: t for p, t in stub.files.items() if p.endswith(".rs")}
    # none of the crate's code: empty sources, a build script only because there are build-dependencies to build
    assert all(b"evil" not in t and b"exit" not in t for t in code.values()), code
    assert doc["package"]["build"] == "build.rs" and "lib" in doc  # type: ignore[index]
    assert stub.lock == LOCK.replace(b'name = "tool"\nversion = "0.1.0"', b'name = "flakebot-deps"\nversion = "0.0.0"')


def test_two_crates_asking_for_the_same_dependencies_have_the_same_stub(tmp_path: Path) -> None:
    manifest = '[dependencies]\na = "1"\n'
    one = stub_of(_workspace(tmp_path / "one", manifest))
    (tmp_path / "two").mkdir()
    other = _workspace(tmp_path / "two", manifest, {"src/main.rs": 'fn main() { println!("other code") }'})
    text = (other / "Cargo.toml").read_text().replace('name = "tool"', 'name = "another"').replace("0.1.0", "2.0.0")
    (other / "Cargo.toml").write_text(text)
    (other / "Cargo.lock").write_bytes(
        LOCK.replace(b'name = "tool"\nversion = "0.1.0"', b'name = "another"\nversion = "2.0.0"')
    )
    two = stub_of(other)
    assert isinstance(one, Stub) and isinstance(two, Stub) and one.digest == two.digest
    (other / "Cargo.toml").write_text(text.replace('a = "1"', 'a = { version = "1", features = ["x"] }'))
    three = stub_of(other)
    assert isinstance(three, Stub) and three.digest != one.digest


def test_without_build_dependencies_the_stub_has_no_build_script(tmp_path: Path) -> None:
    ws = _workspace(tmp_path, '[dependencies]\na = "1"\n', {"src/main.rs": "fn main() {}", "build.rs": "fn main() {}"})
    stub = stub_of(ws)
    assert not isinstance(stub, str)
    assert "build.rs" not in stub.files and _manifest(ws)["package"]["build"] is False  # type: ignore[index]


@pytest.mark.parametrize(
    ("manifest", "why"),
    [
        ('[dependencies]\na = { path = "../a" }\n', "its dependency 'a' is not a registry package"),
        ('[dependencies]\na = { git = "https://example.com/a" }\n', "its dependency 'a' is not a registry package"),
        ("[dependencies]\na = { workspace = true }\n", "its dependency 'a' is not a registry package"),
        ('[patch.crates-io]\na = { path = "a" }\n', "it has [patch]"),
        ('[workspace]\nmembers = ["x"]\n', "it is a cargo workspace of several packages"),
    ],
)
def test_dependencies_from_elsewhere_have_no_stub(tmp_path: Path, manifest: str, why: str) -> None:
    assert stub_of(_workspace(tmp_path, manifest)) == why


def test_the_lock_reads_into_registry_packages_and_their_dependencies() -> None:
    packages = lock_packages(LOCK)
    assert set(packages) == {"a 1.0.0", "b 1.0.0", "c 1.0.0", "c 2.0.0"}  # the root is not a registry package
    assert packages["a 1.0.0"].dependencies == ("b 1.0.0", "c 2.0.0")
    with pytest.raises(ValueError):
        lock_packages(b"[[package]]\nname = 'x'\nsource = 'registry+y'\ndependencies = ['nothing']\n")


# -- the keys --------------------------------------------------------------------------------------------------


def _plan(digests: dict[str, str] | None = None) -> Plan:
    packages = lock_packages(LOCK)
    digests = digests or {p: hashlib.sha256(p.encode()).hexdigest() for p in packages}
    present = frozenset(f"{p} {d}" for p, d in digests.items())
    return Plan(Stub({"Cargo.lock": LOCK}), packages, digests, present, frozenset())


def _cache(
    tmp_path: Path,
    *,
    registry: str = "/reg",
    toolchain: str = "rustc 1.95.0",
    mode: str = "confined",
    environment: dict[str, str] | None = None,
) -> DependencyCache:
    return DependencyCache(
        UnitStore(tmp_path),
        registry=Path(registry),
        toolchain=toolchain,
        mode=mode,
        bus=EventBus(),
        environment=environment or {"LANG": "C.UTF-8"},
    )


RELEASE = DepsBuild("release", "release", ("build", "--release"))


def test_a_key_changes_with_every_input_of_the_unit_and_only_with_those(tmp_path: Path) -> None:
    plan = _plan()
    base = _cache(tmp_path).key(plan, RELEASE, "a 1.0.0")
    assert base is not None
    others = {
        "toolchain": _cache(tmp_path, toolchain="rustc 1.95.0 (wrapped)").key(plan, RELEASE, "a 1.0.0"),
        "registry moved": _cache(tmp_path, registry="/elsewhere").key(plan, RELEASE, "a 1.0.0"),
        "mode": _cache(tmp_path, mode="per-build").key(plan, RELEASE, "a 1.0.0"),
        "the environment (a build script may read it)": _cache(tmp_path, environment={"LANG": "de_DE.UTF-8"}).key(
            plan, RELEASE, "a 1.0.0"
        ),
        "flags": _cache(tmp_path).key(plan, DepsBuild("release", "release", ("build", "--release", "-v")), "a 1.0.0"),
        "profile": _cache(tmp_path).key(plan, DepsBuild("test", "debug", ("build", "--release")), "a 1.0.0"),
        "env": _cache(tmp_path).key(
            plan, DepsBuild("release", "release", ("build", "--release"), {"X": "1"}), "a 1.0.0"
        ),
        "a dependency's files": _cache(tmp_path).key(_plan({**plan.digests, "c 2.0.0": "0" * 64}), RELEASE, "a 1.0.0"),
        "its own files": _cache(tmp_path).key(_plan({**plan.digests, "a 1.0.0": "0" * 64}), RELEASE, "a 1.0.0"),
    }
    assert all(key is not None and key != base for key in others.values()), others
    # what is not in its closure, and how rustc caches the crate's own code, are not
    assert _cache(tmp_path).key(_plan({**plan.digests, "c 1.0.0": "0" * 64}), RELEASE, "a 1.0.0") == base
    incremental = DepsBuild("release", "release", ("build", "--release"), {"CARGO_INCREMENTAL": "0"})
    assert _cache(tmp_path).key(plan, incremental, "a 1.0.0") == base


def test_a_package_not_found_in_the_registry_has_no_key(tmp_path: Path) -> None:
    plan = _plan()
    missing = _plan({**plan.digests, "b 1.0.0": ""})
    assert _cache(tmp_path).key(missing, RELEASE, "a 1.0.0") is None
    assert _cache(tmp_path).key(missing, RELEASE, "c 2.0.0") is not None


def test_per_build_units_serve_only_builds_holding_all_their_writers(tmp_path: Path) -> None:
    plan = _plan()
    cache = _cache(tmp_path, mode="per-build")
    record = UnitRecord("a-0123456789abcdef", "a 1.0.0", "0" * 64, (), ("b 1.0.0 " + plan.digests["b 1.0.0"],), 0.0)
    assert cache.usable(plan, record)
    evil = UnitRecord(record.unit, record.package, record.key, (), ("evil 1.0.0 " + "1" * 64,), 0.0)
    assert not cache.usable(plan, evil), "a writer this build does not hold"
    changed = UnitRecord(record.unit, record.package, record.key, (), ("b 1.0.0 " + "2" * 64,), 0.0)
    assert not cache.usable(plan, changed), "a writer with other files is not the one this build runs"
    assert cache.usable(plan, UnitRecord(record.unit, record.package, record.key, (), None, 0.0))


# -- the store -------------------------------------------------------------------------------------------------

UNIT = "victim-0123456789abcdef"
KEY = "ab" * 32


def _built(profile: Path) -> None:
    (profile / "deps").mkdir(parents=True)
    (profile / "deps" / f"libvictim-{UNIT[-16:]}.rlib").write_bytes(b"rlib bytes")
    (profile / "deps" / f"victim-{UNIT[-16:]}.d").write_text("dep info")
    (profile / "deps" / "libother-fedcba9876543210.rlib").write_bytes(b"not this unit's")
    (profile / ".fingerprint" / UNIT).mkdir(parents=True)
    (profile / ".fingerprint" / UNIT / "lib-victim").write_text("fingerprint")
    (profile / "build" / UNIT / "out").mkdir(parents=True)
    (profile / "build" / UNIT / "out" / "gen.rs").write_text("generated")
    os.chmod(profile / "build" / UNIT / "out" / "gen.rs", 0o755)


def test_a_sealed_unit_is_copied_out_whole_with_its_modes_and_times(tmp_path: Path) -> None:
    store = UnitStore(tmp_path / "units")
    _built(tmp_path / "t" / "release")
    record = store.seal(tmp_path / "t" / "release", UNIT, "victim 1.0.0", KEY, None)
    assert record is not None
    assert {f.path for f in record.files} == {
        f"deps/libvictim-{UNIT[-16:]}.rlib",
        f"deps/victim-{UNIT[-16:]}.d",
        f".fingerprint/{UNIT}/lib-victim",
        f"build/{UNIT}/out/gen.rs",
    }
    objects = [p for p in (tmp_path / "units" / "objects").rglob("*") if p.is_file()]
    assert objects and all(p.stat().st_mode & 0o222 == 0 for p in objects), "objects are read-only"
    dest = tmp_path / "fresh"
    dest.mkdir()
    assert store.copy_out(record, dest, "target/release")
    for file in record.files:
        copied = dest / "target" / "release" / file.path
        assert copied.read_bytes() == (tmp_path / "t" / "release" / file.path).read_bytes()
        assert copied.stat().st_mtime_ns == file.mtime_ns and copied.stat().st_nlink == 1, "copied, never linked"
    assert os.access(dest / "target" / "release" / "build" / UNIT / "out" / "gen.rs", os.X_OK)
    assert store.get(KEY, UNIT) == record and store.find(KEY) == [record]
    assert store.seal(tmp_path / "t" / "release", UNIT, "victim 1.0.0", KEY, ["x"]) == record, "the first seal stands"


def test_a_unit_whose_bytes_changed_in_the_store_is_never_copied_out(tmp_path: Path) -> None:
    store = UnitStore(tmp_path / "units")
    _built(tmp_path / "t" / "release")
    record = store.seal(tmp_path / "t" / "release", UNIT, "victim 1.0.0", KEY, None)
    assert record is not None
    rlib = next(f for f in record.files if f.path.endswith(".rlib"))
    obj = store._object(rlib.sha256)
    os.chmod(obj, 0o644)
    obj.write_bytes(b"rlib BYTES")  # the same length: only the hash tells
    dest = tmp_path / "fresh"
    dest.mkdir()
    assert not store.copy_out(record, dest, "release")
    assert not [p for p in dest.rglob("*") if p.is_file()], "nothing of a damaged unit is left in the target"
    assert store.get(KEY, UNIT) is None, "the record is set aside"
    assert list((tmp_path / "units" / "aside").iterdir())


def test_a_copy_never_follows_a_link_planted_in_the_target(tmp_path: Path) -> None:
    store = UnitStore(tmp_path / "units")
    _built(tmp_path / "t" / "release")
    record = store.seal(tmp_path / "t" / "release", UNIT, "victim 1.0.0", KEY, None)
    assert record is not None
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "ws"
    (dest / "target" / "release").mkdir(parents=True)
    (dest / "target" / "release" / "deps").symlink_to(outside)  # what a test in the workspace could plant
    assert not store.copy_out(record, dest, "target/release")
    assert list(outside.iterdir()) == [], "nothing was written through the link"


def test_a_unit_with_a_link_in_it_is_not_sealed(tmp_path: Path) -> None:
    store = UnitStore(tmp_path / "units")
    _built(tmp_path / "t" / "release")
    (tmp_path / "t" / "release" / "build" / UNIT / "out" / "link").symlink_to("/etc/passwd")
    assert store.seal(tmp_path / "t" / "release", UNIT, "victim 1.0.0", KEY, None) is None


@pytest.mark.parametrize(
    "path",
    [
        "../../escape",
        "deps/libother-fedcba9876543210.rlib",
        ".fingerprint/other-fedcba9876543210/x",
        "deps/../x",
        "/abs",
    ],
)
def test_a_record_naming_a_file_outside_its_unit_is_not_read(tmp_path: Path, path: str) -> None:
    data = {
        "format": 1,
        "unit": UNIT,
        "package": "victim 1.0.0",
        "key": KEY,
        "files": [[path, "0" * 64, 0o644, 0, 1]],
        "writers": None,
        "sealed_at": 0,
    }
    with pytest.raises(ValueError):
        UnitRecord.from_json(data)


def test_check_sets_aside_what_differs_and_sweep_removes_what_no_record_names(tmp_path: Path) -> None:
    store = UnitStore(tmp_path / "units")
    _built(tmp_path / "t" / "release")
    record = store.seal(tmp_path / "t" / "release", UNIT, "victim 1.0.0", KEY, None)
    assert record is not None
    stray = store._object("cd" * 32)
    stray.parent.mkdir(parents=True, exist_ok=True)
    stray.write_bytes(b"no record names me")
    assert store.check() == []
    assert not stray.exists()
    obj = store._object(record.files[0].sha256)
    os.chmod(obj, 0o644)
    obj.write_bytes(b"x" * record.files[0].size)
    assert len(store.check()) == 1 and store.get(KEY, UNIT) is None
    assert store.usage()[0] == 0


# -- clean and doctor ------------------------------------------------------------------------------------------


def _sealed_in(cache: Path, tmp_path: Path) -> UnitRecord:
    from flakebot_magic.config import Settings

    units = Settings(cache_dir=cache).cache.units
    _built(tmp_path / "t" / "release")
    record = UnitStore(units).seal(tmp_path / "t" / "release", UNIT, "victim 1.0.0", KEY, None)
    assert record is not None
    return record


def test_clean_keeps_the_units_and_sweeps_what_no_record_names(tmp_path: Path) -> None:
    from flakebot_magic.config import Settings
    from flakebot_magic.manage.cleanup import clean

    settings = Settings(cache_dir=tmp_path / "cache")
    record = _sealed_in(settings.cache_dir, tmp_path)
    store = UnitStore(settings.cache.units)
    stray = store._object("cd" * 32)
    stray.parent.mkdir(parents=True, exist_ok=True)
    stray.write_bytes(b"an object no record names")
    (store.stubs / "leftover" / "target").mkdir(parents=True)
    report = clean(settings)
    assert store.get(KEY, UNIT) == record and store.copy_out(record, tmp_path, "out")
    assert not stray.exists() and not (store.stubs / "leftover").exists()
    assert "kept the dependency cache: 1 compiled dependency unit" in report.text
    clean(settings, everything=True)
    assert store.usage()[0] == 0


def test_doctor_sets_aside_a_unit_whose_objects_differ(tmp_path: Path) -> None:
    from flakebot_magic.config import Settings
    from flakebot_magic.manage.doctor import doctor

    settings = Settings(cache_dir=tmp_path / "cache")
    record = _sealed_in(settings.cache_dir, tmp_path)
    store = UnitStore(settings.cache.units)
    assert not [line for line in doctor(settings).set_aside if "dependency unit" in line]
    obj = store._object(record.files[0].sha256)
    os.chmod(obj, 0o644)
    obj.write_bytes(b"?" * record.files[0].size)
    assert [line for line in doctor(settings).text.splitlines() if f"set aside the dependency unit {UNIT}" in line]
    assert store.get(KEY, UNIT) is None
