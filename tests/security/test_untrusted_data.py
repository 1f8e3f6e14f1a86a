"""Untrusted data, by construction: what a crate, a registry, a tool or nix says is data, never a path flakebot follows.

Invariants, each tested over every door rather than attack by attack (issue 19; the red team's A03-A18):

1. **One reader for named files.** Every file that crate data, registry data, tool output or nix output names is
   opened outside the sandbox only through :func:`~flakebot_magic.host.fsutil.read_inside` (or, for a path
   flakebot chose itself, ``read_regular`` / ``copy_regular``): structurally, no other open exists in the modules
   that handle such data; and by property, over generated paths and planted files, it never returns a byte from
   outside the root, never follows a link, never blocks.
2. **One validator for names.** Every crate name, version and binary name from a registry or a manifest passes
   :func:`~flakebot_magic.registry.base.check_crate_field` (every ``CrateCandidate`` is made through it): what it
   accepts is one path component, by property; hostile ones are refused at the directory index and crates.io.
3. **The policy reads a manifest as cargo does.** Any dependency, whatever its name (``metadata`` included), in
   any table cargo reads, with any source key, is refused (property), and real cargo agrees with the policy
   about which manifests bring in a source other than the registry (differential, ``cargo metadata`` as oracle).
4. **No traceback from bad input.** Malformed manifests and registry entries give a FlakebotError or are left out,
   through the policy, the directory index and the fork (property and fuzz).
5. **A published source is capped**, however few bytes it weighs packed (a sparse member), and special files in
   a registry are never read.
"""

from __future__ import annotations

import ast
import io
import json
import os
import signal
import stat
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tinycrates import Crate, write_registry

import flakebot_magic
from flakebot_magic.backends.nix_command import flake_error
from flakebot_magic.errors import FlakebotError, ForkError, RegistryError
from flakebot_magic.events import EventBus
from flakebot_magic.host.fsutil import UnsafePath, read_inside
from flakebot_magic.host.process import Completed, ProcessRunner
from flakebot_magic.registry.base import MAX_SOURCE_BYTES, CrateCandidate, check_crate_field
from flakebot_magic.registry.crate_archive import unpack_crate
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.sandbox.cargo import Cargo
from flakebot_magic.sandbox.manifest import DEPENDENCY_TABLES
from flakebot_magic.sandbox.policy import check_manifest, check_tree
from flakebot_magic.stages.fork import fork
from flakebot_magic.stages.source import import_source

PACKAGE = Path(flakebot_magic.__file__).parent
SECRET = "SECRET-outside-the-crate-zqxjkv4f1d"
#: a word of it the index would hold if it read it
SECRET_WORD = "zqxjkv4f1d"

# -- 1. one reader for the files untrusted data names ----------------------------------------

#: the modules that read what a crate, a registry, a tool or nix hands over, outside the sandbox
UNTRUSTED_READERS = (
    # every module of the registry package (a new one is scanned without being named here)
    *sorted(
        p.relative_to(PACKAGE).as_posix()
        for p in (PACKAGE / "registry").glob("*.py")
        if p.name not in ("__init__.py", "embedding.py")  # embedding: the model's own files, not crate data
    ),
    "stages/source.py",
    "stages/choose.py",
    "sandbox/policy.py",
    "backends/nix_command.py",
)
#: opens allowed there, each of a file flakebot itself wrote: (module, the call's source text)
OWN_FILES = {
    # the build lock beside an index, in a place only root or this user can write (registry/shared_index.py)
    ("registry/shared_index.py", "os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 384)"),
}
#: method names that open or copy a file by path
_OPENING = {"open", "read_text", "read_bytes", "copy", "copy2", "copyfile", "copytree", "write_text", "write_bytes"}


def _opens(module: str) -> Iterator[str]:
    source = (PACKAGE / module).read_text()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "open":
            yield ast.get_source_segment(source, node) or "open(...)"
        elif isinstance(func, ast.Attribute) and func.attr in _OPENING:
            owner = ast.unparse(func.value)
            if owner == "copy":
                continue  # the copy module: objects, not files
            if owner == "tarfile" and any(k.arg == "fileobj" for k in node.keywords):
                continue  # an archive in memory
            if func.attr == "copytree" and any(k.arg == "copy_function" for k in node.keywords):
                continue  # files copied by the careful copy it is given
            text = ast.unparse(node)
            if (module, text) not in OWN_FILES:
                yield text


@pytest.mark.parametrize("module", UNTRUSTED_READERS)
def test_no_file_named_by_untrusted_data_is_opened_but_through_read_inside(module: str) -> None:
    """Structural: the modules that read crate, registry, tool and nix data open files only through fsutil."""
    assert list(_opens(module)) == []


def test_the_structural_check_sees_an_open() -> None:
    """The scan above is not blind: it finds the opens of a module that has them."""
    assert any("read_text" in call for call in _opens("host/fsutil.py"))


@pytest.fixture(scope="module")
def crate_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A crate with a README, and beside it a secret, links out of it, a FIFO and a device."""
    base = tmp_path_factory.mktemp("reader")
    (base / "secret").write_text(SECRET)
    root = base / "crate"
    (root / "src").mkdir(parents=True)
    (root / "README.md").write_text("inside")
    (root / "src" / "lib.rs").write_text("inside")
    (root / "out").symlink_to(base / "secret")
    (root / "outdir").symlink_to(base)
    (root / "src" / "up").symlink_to("..")
    os.mkfifo(root / "fifo")
    (root / "zero").symlink_to("/dev/zero")
    return root


_PARTS = st.sampled_from(
    ["..", ".", "", "src", "README.md", "lib.rs", "out", "outdir", "up", "fifo", "zero", "secret", "crate", "proc"]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(_PARTS, min_size=1, max_size=6), absolute=st.booleans(), sep=st.sampled_from(["/", "\\"]))
def test_read_inside_never_reads_outside_follows_a_link_or_blocks(
    crate_root: Path, parts: list[str], absolute: bool, sep: str
) -> None:
    relative = ("/" if absolute else "") + sep.join(parts)
    signal.alarm(5)  # a read that blocks fails the test instead of hanging it
    try:
        data, _ = read_inside(crate_root, relative, 1024)
    except (UnsafePath, FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return
    finally:
        signal.alarm(0)
    assert data == b"inside"
    assert ".." not in PurePosixPath(relative.replace("\\", "/")).parts


@pytest.mark.parametrize(
    "field",
    [
        'readme = "/proc/self/environ"',
        'readme = "../secret"',
        'readme = "out"',
        'readme = "fifo"',
        'readme = "/proc/kmsg"',
        'readme = "outdir/secret"',
    ],
)
def test_the_index_reads_no_file_a_manifest_names_outside_its_crate(tmp_path: Path, field: str) -> None:
    """A04/A04b through the real door: the directory index of a crate naming a host file, a link or a FIFO."""
    (tmp_path / "secret").write_text(SECRET)
    registry = write_registry(
        tmp_path / "registry",
        [Crate("namer", "0.1.0", f'[package]\nname = "namer"\nversion = "0.1.0"\n{field}\n', {"src/main.rs": ""})],
    )
    crate_dir = registry / "namer-0.1.0"
    (crate_dir / "out").symlink_to(tmp_path / "secret")
    (crate_dir / "outdir").symlink_to(tmp_path)
    os.mkfifo(crate_dir / "fifo")
    os.environ["FLAKEBOT_TEST_CANARY"] = SECRET
    signal.alarm(20)
    try:
        opened = DirectoryRegistry(registry, tmp_path / "cache")
        assert opened.search("namer") and opened.frequencies([SECRET_WORD]) == {}
        opened.close()
    finally:
        signal.alarm(0)
        del os.environ["FLAKEBOT_TEST_CANARY"]
    assert SECRET_WORD.encode() not in b"".join(p.read_bytes() for p in (tmp_path / "cache").rglob("*") if p.is_file())


def test_a_nix_error_never_opens_the_path_nix_names(tmp_path: Path) -> None:
    """A09: the location in nix's stderr is text; only flakebot's own flake.nix is quoted, and never through a link."""
    (tmp_path / "secret").write_text(SECRET + "\n")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    store = "/nix/store/" + "a" * 32 + "-source"
    for named in ("../secret", "Cargo.lock", "flake.nix"):
        (workspace / "Cargo.lock").unlink(missing_ok=True)
        (workspace / "Cargo.lock").symlink_to(tmp_path / "secret")
        (workspace / "flake.nix").unlink(missing_ok=True)
        (workspace / "flake.nix").symlink_to(tmp_path / "secret")
        done = Completed(["nix"], 1, "", f"error: syntax error\n       at {store}/{named}:1:1:\n", 0.1)
        error = flake_error(done, workspace, "nix build failed")
        assert SECRET not in str(error) and f"{named}:1:1" in str(error)


# -- 2. one validator for names and versions ------------------------------------------------


@settings(max_examples=500, deadline=None)
@given(kind=st.sampled_from(["name", "version", "binary"]), value=st.text(max_size=80))
def test_an_accepted_name_or_version_is_one_path_component(kind: str, value: str) -> None:
    try:
        check_crate_field(kind, value)
    except RegistryError:
        return
    store = PurePosixPath("/store")
    for path in (store / value, store / f"key-crate-{value}", store / f"{value}-0.1.0"):
        assert path.parent == store and ".." not in path.parts
    assert not value.startswith(("-", ".")) and value.isascii() and value.isprintable()


@pytest.mark.parametrize(
    ("field", "value"),
    [("version", "0.1.0/../../../tmp/x"), ("name", "../evil"), ("version", ".."), ("name", "-rf")],
)
def test_every_candidate_is_validated_when_it_is_made(field: str, value: str) -> None:
    with pytest.raises(RegistryError, match="malformed or hostile"):
        CrateCandidate(**{"name": "ok", "version": "0.1.0", field: value})  # type: ignore[arg-type]
    with pytest.raises(RegistryError):
        CrateCandidate("ok", "0.1.0", bin_names=("../../bin/sh",))


def test_the_directory_index_leaves_out_crates_whose_version_is_a_path(tmp_path: Path) -> None:
    bad = '[package]\nname = "trav"\nversion = "0.1.0/../../x"\n'
    registry = write_registry(tmp_path / "registry", [Crate("trav", "0.1.0", bad, {"src/main.rs": ""}), "tinyecho"])
    opened = DirectoryRegistry(registry, tmp_path / "cache")
    try:
        assert opened.versions("trav") == [] and opened.versions("tinyecho")
    finally:
        opened.close()


# -- 3. the policy reads a manifest as cargo does --------------------------------------------

_NAMES = st.one_of(
    st.sampled_from(["metadata", "package", "workspace", "path", "git", "dependencies", "x"]),
    st.from_regex(r"[a-z][a-z0-9_-]{0,12}", fullmatch=True),
)
_SOURCES = st.sampled_from(
    [
        {"git": "http://127.0.0.1:9/exfil"},
        {"git": "file:///root/private", "branch": "main"},
        {"version": "1", "registry-index": "sparse+http://127.0.0.1:9/"},
        {"version": "1", "registry": "elsewhere"},
        {"path": "../outside"},
        {"path": "/etc"},
        {"path": "target/evil"},
        {"path": ".git/x"},
        {"base": "home", "path": "x"},
        {"version": "1", "artifact": "bin"},
        {"version": "1", "some-future-key": "x"},
    ]
)


def _place(table: str, where: str, name: str, spec: dict[str, str]) -> dict[str, object]:
    doc: dict[str, object] = {"package": {"name": "x", "version": "0.1.0"}}
    if where == "top":
        doc[table] = {name: spec}
    elif where == "target":
        doc["target"] = {"cfg(unix)": {table: {name: spec}}}
    else:
        doc["workspace"] = {"dependencies": {name: spec}}
    return doc


@settings(max_examples=300, deadline=None)
@given(
    table=st.sampled_from(DEPENDENCY_TABLES),
    where=st.sampled_from(["top", "target", "workspace"]),
    name=_NAMES,
    spec=_SOURCES,
)
def test_a_dependency_from_another_source_is_refused_whatever_it_is_called_and_wherever_it_is(
    table: str, where: str, name: str, spec: dict[str, str]
) -> None:
    root = Path("/ws")
    found = check_manifest(root, root / "Cargo.toml", _place(table, where, name, spec))
    assert found, (table, where, name, spec)
    assert any(name in v.reason for v in found), found


@settings(max_examples=200, deadline=None)
@given(key=st.from_regex(r"[a-z][a-z0-9_-]{0,10}", fullmatch=True), value=_SOURCES)
def test_an_unknown_top_level_table_is_refused_unless_it_is_cargos(key: str, value: dict[str, str]) -> None:
    from flakebot_magic.sandbox.manifest import _TOP_LEVEL

    doc = {"package": {"name": "x", "version": "0.1.0"}, key: {"dep": value}}
    found = check_manifest(Path("/ws"), Path("/ws/Cargo.toml"), doc)
    if key not in _TOP_LEVEL:
        assert any(key in v.reason and "does not define" in v.reason for v in found), found


def test_package_and_workspace_metadata_are_free_form_by_position_not_by_name() -> None:
    doc = {
        "package": {"name": "x", "version": "0.1.0", "metadata": {"deps": {"git": "http://x"}}},
        "workspace": {"metadata": {"path": "/etc"}},
        "dependencies": {"serde": "1", "metadata": {"version": "1", "package": "serde"}},
    }
    assert check_manifest(Path("/ws"), Path("/ws/Cargo.toml"), doc) == []


def _toml(value: object) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f'"{k}" = {_toml(v)}' for k, v in value.items()) + " }"
    return json.dumps(value)


@pytest.mark.cargo
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    table=st.sampled_from(DEPENDENCY_TABLES),
    where=st.sampled_from(["top", "target"]),
    name=_NAMES,
    spec=st.one_of(_SOURCES, st.just({"version": "1"}), st.just({"path": "member"})),
)
def test_cargo_itself_agrees_every_manifest_with_a_foreign_source_is_refused(
    tmp_path_factory: pytest.TempPathFactory, table: str, where: str, name: str, spec: dict[str, str]
) -> None:
    """Differential: real cargo (``cargo metadata --no-deps``, offline, nothing fetched) is the oracle for what a
    manifest's dependencies are; whenever cargo sees one from git, another registry, or a path outside the crate
    or into target/, the policy has refused the manifest."""
    root = tmp_path_factory.mktemp("oracle") / "ws"
    (root / "src").mkdir(parents=True)
    (root / "src" / "lib.rs").write_text("")
    (root / "member" / "src").mkdir(parents=True)
    (root / "member" / "Cargo.toml").write_text(f'[package]\nname = "{name}"\nversion = "1.0.0"\n')
    (root / "member" / "src" / "lib.rs").write_text("")
    head = '[package]\nname = "x"\nversion = "0.1.0"\nedition = "2021"\n'
    where_table = table if where == "top" else f"target.'cfg(unix)'.{table}"
    (root / "Cargo.toml").write_text(f'{head}\n[{where_table}]\n"{name}" = {_toml(spec)}\n')
    home = root.parent / "cargo-home"
    home.mkdir()
    done = subprocess.run(
        ["cargo", "metadata", "--no-deps", "--offline", "--format-version", "1"],
        cwd=root,
        capture_output=True,
        text=True,
        env={**os.environ, "CARGO_HOME": str(home)},
        timeout=60,
    )
    refused = check_tree(root)
    if done.returncode != 0:
        return  # cargo will not build it either
    deps = [d for p in json.loads(done.stdout)["packages"] for d in p["dependencies"]]
    real_root = os.path.realpath(root)
    foreign = [
        d
        for d in deps
        if (d.get("source") or "").startswith("git+")
        or (d.get("registry") not in (None, ""))
        or (d.get("path") and not (os.path.realpath(d["path"]) + "/").startswith(real_root + "/"))
        or (d.get("path") and os.path.realpath(d["path"]).startswith(real_root + "/target"))
    ]
    if foreign:
        assert refused, (foreign, (root / "Cargo.toml").read_text())


# -- 4. no traceback from bad input ----------------------------------------------------------

_SCALARS = st.one_of(st.integers(), st.text(max_size=8), st.booleans(), st.lists(st.integers(), max_size=2))
_HOSTILE_MANIFESTS = st.one_of(
    st.text(max_size=200),
    st.integers(min_value=1, max_value=6000).map(lambda n: "a = " + "[" * n + "]" * n),
    st.integers(min_value=1, max_value=6000).map(lambda n: "a = " + "{x=" * n),
    st.fixed_dictionaries(
        {},
        optional={
            "package": st.one_of(
                _SCALARS,
                st.fixed_dictionaries(
                    {},
                    optional={
                        "name": _SCALARS,
                        "version": _SCALARS,
                        "build": _SCALARS,
                        "readme": _SCALARS,
                        "workspace": _SCALARS,
                    },
                ),
            ),
            "lib": st.one_of(_SCALARS, st.fixed_dictionaries({}, optional={"path": _SCALARS, "crate-type": _SCALARS})),
            "bin": st.one_of(
                _SCALARS, st.lists(st.fixed_dictionaries({}, optional={"name": _SCALARS, "path": _SCALARS}))
            ),
            "dependencies": st.one_of(_SCALARS, st.dictionaries(st.text(max_size=5), st.one_of(_SCALARS, _SOURCES))),
            "target": st.one_of(_SCALARS, st.dictionaries(st.text(max_size=5), _SCALARS)),
            "workspace": st.one_of(_SCALARS, st.fixed_dictionaries({}, optional={"members": _SCALARS})),
        },
    ).map(lambda doc: "\n".join(f"{k} = {_toml(v)}" for k, v in doc.items())),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_HOSTILE_MANIFESTS, member=st.booleans())
def test_the_policy_reports_any_manifest_and_never_raises(
    tmp_path_factory: pytest.TempPathFactory, text: str, member: bool
) -> None:
    """A08 and its class: a malformed root or member manifest is a violation, never a traceback."""
    root = tmp_path_factory.mktemp("policy")
    if member:
        (root / "Cargo.toml").write_text('[package]\nname = "x"\nversion = "0.1.0"\n[workspace]\nmembers = ["m"]\n')
        (root / "m").mkdir()
        (root / "m" / "Cargo.toml").write_text(text)
    else:
        (root / "Cargo.toml").write_text(text)
    check_tree(root)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(_HOSTILE_MANIFESTS, min_size=1, max_size=4))
def test_the_index_takes_any_registry_and_never_raises(
    tmp_path_factory: pytest.TempPathFactory, texts: list[str]
) -> None:
    root = tmp_path_factory.mktemp("index")
    registry = write_registry(root / "registry", ["tinyecho"])
    for i, text in enumerate(texts):
        (registry / f"junk{i}").mkdir()
        (registry / f"junk{i}" / "Cargo.toml").write_text(text)
    opened = DirectoryRegistry(registry, root / "cache")
    try:
        assert [c.name for c in opened.search("echo")][:1] == ["tinyecho"]
    finally:
        opened.close()


@pytest.mark.cargo
@pytest.mark.parametrize(
    "member",
    [
        "a = " + "[" * 3000 + "]" * 3000,  # RecursionError in the parser (A08)
        '[package]\nname = 5\nversion = ["x"]\n',
        '[package]\nname = "m"\nversion = "0.1.0"\n[dependencies]\nmetadata = { package = "e", git = "http://x" }\n',
        '[package]\nname = "m"\nversion = "0.1.0"\n[lib]\npath = "/etc/passwd"\n',
    ],
)
def test_forking_a_crate_with_a_hostile_member_is_a_clear_error(tmp_path: Path, member: str) -> None:
    """Through the real fork (directory registry, sandboxed lock-file step): a FlakebotError or a fork, no traceback."""
    head = '[package]\nname = "deep"\nversion = "0.1.0"\nedition = "2021"\n[workspace]\nmembers = ["m"]\n'
    registry = write_registry(
        tmp_path / "registry",
        [Crate("deep", "0.1.0", head, {"src/lib.rs": "", "m/Cargo.toml": member, "m/src/lib.rs": ""})],
    )
    opened = DirectoryRegistry(registry, tmp_path / "cache")
    runner = ProcessRunner()
    try:
        with pytest.raises(FlakebotError) as error:
            fork(
                opened.get("deep"),
                opened,
                tmp_path / "ws",
                "deep",
                runner=runner,
                bus=EventBus([]),
                cargo=Cargo(opened, runner),
            )
        assert "Traceback" not in str(error.value)
    finally:
        opened.close()


# -- 5. a published source is capped; special files are never read ---------------------------


def _crate_archive(top: str, members: dict[str, int]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, size in members.items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = size
            tar.addfile(info, io.BytesIO(b"\0" * min(size, 16)) if size <= 16 else _Zeros(size))
    return buffer.getvalue()


class _Zeros(io.RawIOBase):
    """``size`` zero bytes, read lazily (a big member costs no memory to write)."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray) -> int:  # type: ignore[override]
        n = min(len(buffer), self.left)
        buffer[:n] = b"\0" * n
        self.left -= n
        return n


def test_a_crate_that_unpacks_past_the_cap_is_refused_before_a_byte_is_written(tmp_path: Path) -> None:
    """A05: the sizes members declare are summed first (here a member one byte past the cap; a sparse one is the same)."""
    archive = _crate_archive("bomb-0.1.0", {"Cargo.toml": 8, "src/big.bin": MAX_SOURCE_BYTES + 1})
    with pytest.raises(RegistryError, match="more than a crate may"):
        unpack_crate(archive, tmp_path / "dest", top="bomb-0.1.0", label="bomb@0.1.0")
    assert not any((tmp_path / "dest").rglob("*"))


def test_a_sparse_file_past_the_cap_is_refused_by_the_import(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    with (source / "sparse").open("wb") as handle:
        handle.truncate(MAX_SOURCE_BYTES + 1)  # no blocks on disk; reads as that many zeros
    (tmp_path / "dest").mkdir()
    with pytest.raises(ForkError, match="more than"):
        import_source(source, tmp_path / "dest")
    assert sum(p.stat().st_size for p in (tmp_path / "dest").rglob("*")) == 0


def test_special_files_in_a_directory_registry_are_never_read(tmp_path: Path) -> None:
    """A11: a FIFO and a character device (/dev/zero's numbers) in a registry's crate are left out of the copy."""
    registry = write_registry(tmp_path / "registry", ["tinyecho"])
    crate_dir = next(p for p in registry.iterdir() if p.name.startswith("tinyecho"))
    os.mkfifo(crate_dir / "pipe")
    try:
        os.mknod(crate_dir / "zero", stat.S_IFCHR | 0o600, os.makedev(1, 5))
    except PermissionError:
        pass  # not root: the FIFO is the case
    opened = DirectoryRegistry(registry, tmp_path / "cache")
    signal.alarm(20)
    try:
        fetched = opened.fetch(opened.get("tinyecho"), tmp_path / "dest")
    finally:
        signal.alarm(0)
        opened.close()
    names = {p.name for p in fetched.path.rglob("*")}
    assert "pipe" not in names and "zero" not in names and "Cargo.toml" in names
