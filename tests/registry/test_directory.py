"""DirectoryRegistry over real cargo directory sources written by the tests."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from damage import WAYS, damage
from tinycrates import crate, write_crate, write_registry

from flakebot_magic.errors import ConfigError, SearchError
from flakebot_magic.registry import Registry
from flakebot_magic.registry.base import FetchedSource
from flakebot_magic.registry.directory import DirectoryRegistry, tree_sha256


@pytest.fixture
def registry_dir(tmp_path: Path) -> Path:
    # a library with a 200-word README that says "echo" eight times, and nothing else does
    words = (
        [
            "lorem",
            "ipsum",
            "dolor",
            "sit",
            "amet",
            "consectetur",
            "adipiscing",
            "elit",
            "sed",
            "do",
            "eiusmod",
            "tempor",
        ]
        * 20
    )[:200]
    words[::25] = ["echo"] * 8
    decoy = crate(
        "echodecoy",
        description="A library that mentions the word only in its readme",
        files={"src/lib.rs": "", "README.md": " ".join(words) + "\n"},
    )
    return write_registry(tmp_path / "registry", ["tinyecho", "tinylib", "brokenbin", "needsdev", decoy])


@pytest.fixture
def registry(registry_dir: Path, tmp_path: Path) -> Iterator[DirectoryRegistry]:
    opened = DirectoryRegistry(registry_dir, tmp_path / "cache")
    yield opened
    opened.close()


def _names(registry: DirectoryRegistry, query: str) -> list[str]:
    return [c.name for c in registry.search(query)]


def _stamp(path: Path) -> tuple[int, int]:
    # the index is replaced by os.replace on a rebuild: a new inode and a new mtime
    st = path.stat()
    return st.st_ino, st.st_mtime_ns


# -- the index ---------------------------------------------------------------


def test_implements_registry_protocol(registry: DirectoryRegistry, registry_dir: Path) -> None:
    assert isinstance(registry, Registry)
    assert registry.offline is True
    assert registry.id == f"dir:{registry_dir.resolve()}"
    assert f'directory = "{registry_dir.resolve()}"' in registry.cargo_config()


def test_index_holds_every_crate_and_skips_what_is_not_one(registry_dir: Path, tmp_path: Path) -> None:
    (registry_dir / "not-a-crate").mkdir()
    (registry_dir / "stray-file.txt").write_text("hello")
    broken = registry_dir / "broken-0.1.0"
    broken.mkdir()
    (broken / "Cargo.toml").write_text("[package\nname = ")
    opened = DirectoryRegistry(registry_dir, tmp_path / "cache")
    try:
        assert _names(opened, "tinyecho") == ["tinyecho"]  # a broken manifest does not break search
        assert opened.index_path.is_file()
        assert opened.index_path.parent in opened.index.places  # the machine's, the user's or the cache dir's
        with sqlite3.connect(opened.index_path) as db:
            rows = sorted(db.execute("SELECT name, version FROM crates").fetchall())
        db.close()
    finally:
        opened.close()
    assert rows == [
        ("brokenbin", "0.1.0"),
        ("echodecoy", "0.1.0"),
        ("needsdev", "0.1.0"),
        ("tinyecho", "0.2.0"),
        ("tinylib", "0.1.3"),
    ]


def test_name_and_keyword_matches_rank_first(registry: DirectoryRegistry) -> None:
    # echodecoy says "echo" eight times, but only in its README
    assert _names(registry, "echo")[:2] == ["tinyecho", "echodecoy"]
    assert _names(registry, "uppercase")[0] == "tinylib"
    assert _names(registry, "brokenbin")[0] == "brokenbin"


def test_scores_are_positive_and_descending(registry: DirectoryRegistry) -> None:
    scores = [c.score for c in registry.search("echo shout uppercase")]
    assert len(scores) >= 2
    assert all(s > 0 for s in scores)
    assert scores == sorted(scores, reverse=True)


def test_readme_text_is_searched(registry: DirectoryRegistry) -> None:
    # "zebra" appears only in tinyecho's README
    assert _names(registry, "zebra") == ["tinyecho"]


def test_stopwords_alone_still_search(registry: DirectoryRegistry) -> None:
    assert registry.search("") == []
    assert _names(registry, "the tool for echo")[0] == "tinyecho"


def test_candidate_fields(registry: DirectoryRegistry) -> None:
    [echo] = [c for c in registry.search("echo") if c.name == "tinyecho"]
    assert echo.version == "0.2.0"
    assert echo.description == "Echo words, or shout standard input"
    assert echo.keywords == ("echo", "shout")
    assert echo.license == "MIT"
    assert echo.has_bin and echo.bin_names == ("tinyecho",)
    assert echo.registry == registry.id
    assert echo.checksum is None


def test_index_is_reused_by_a_second_instance(registry_dir: Path, tmp_path: Path) -> None:
    first = DirectoryRegistry(registry_dir, tmp_path / "cache")
    first.search("echo")
    first.close()
    before = _stamp(first.index_path)
    second = DirectoryRegistry(registry_dir, tmp_path / "cache")
    try:
        assert _names(second, "echo")[0] == "tinyecho"
        assert _stamp(second.index_path) == before
    finally:
        second.close()


def test_index_is_rebuilt_when_a_crate_is_added(registry_dir: Path, tmp_path: Path) -> None:
    first = DirectoryRegistry(registry_dir, tmp_path / "cache")
    assert _names(first, "zebu") == []
    first.close()
    before = _stamp(first.index_path)
    write_crate(registry_dir, crate("newcomer", description="A brand new zebu counter"))
    second = DirectoryRegistry(registry_dir, tmp_path / "cache")
    try:
        assert _names(second, "zebu") == ["newcomer"]
        assert _stamp(second.index_path) != before
    finally:
        second.close()


def test_a_corrupt_index_is_rebuilt(registry_dir: Path, tmp_path: Path) -> None:
    first = DirectoryRegistry(registry_dir, tmp_path / "cache")
    first.search("echo")
    first.close()
    first.index_path.write_bytes(b"this is not sqlite")
    second = DirectoryRegistry(registry_dir, tmp_path / "cache")
    try:
        assert _names(second, "echo")[0] == "tinyecho"
    finally:
        second.close()


def _damage(index: Path, how: str) -> None:
    if how == "bad-row":
        with sqlite3.connect(index) as db:
            db.execute("UPDATE crates SET bins = '{not json', keywords = 'x' WHERE name = 'tinyecho'")
    else:  # a bad page: the crates table's, so the signature in meta still reads and the search meets it
        damage(index, how, table="crates")


@pytest.mark.parametrize("how", [*WAYS, "bad-row"])
def test_a_damaged_index_is_made_again_at_the_next_search(registry_dir: Path, tmp_path: Path, how: str) -> None:
    first = DirectoryRegistry(registry_dir, tmp_path / "cache")
    expected = _names(first, "echo")
    first.close()
    _damage(first.index_path, how)
    second = DirectoryRegistry(registry_dir, tmp_path / "cache")
    try:
        assert _names(second, "echo") == expected and expected[0] == "tinyecho"
        assert second.get("tinyecho").bin_names == ("tinyecho",)
        assert second.versions("tinylib") == ["0.1.3"]
    finally:
        second.close()
    with sqlite3.connect(second.index_path) as db:  # made again, whole
        assert db.execute("PRAGMA quick_check").fetchone() == ("ok",)


def test_an_index_that_cannot_be_written_is_kept_in_memory(registry_dir: Path, tmp_path: Path) -> None:
    only = tmp_path / "cache" / "index"  # the one place it may go (no machine's, no user's)
    registry = DirectoryRegistry(registry_dir, tmp_path / "cache", places=[only])
    registry.index_path.mkdir(parents=True)  # where the file goes stands a directory: it cannot be written
    try:
        assert _names(registry, "echo")[0] == "tinyecho"
        assert registry.get("tinyecho").name == "tinyecho"
    finally:
        registry.close()
    assert registry.index_path.is_dir()


def test_missing_registry_path_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist") as caught:
        DirectoryRegistry(tmp_path / "nowhere", tmp_path / "cache")
    assert "--registry" in str(caught.value)
    assert "cargo vendor" in str(caught.value)


# -- get -----------------------------------------------------------------------


def test_get_unknown_crate_says_what_to_do(registry: DirectoryRegistry) -> None:
    with pytest.raises(SearchError) as caught:
        registry.get("nope")
    message = str(caught.value)
    assert "no crate named 'nope'" in message
    assert str(registry.path) in message
    assert "Check the spelling" in message


def test_get_unknown_crate_suggests_names_a_typo_away(registry: DirectoryRegistry) -> None:
    with pytest.raises(SearchError, match=r"Did you mean tinyecho\?"):
        registry.get("tiny_echo")
    with pytest.raises(SearchError, match=r"Did you mean tinylib\?"):
        registry.get("tinylibb")


def test_get_unknown_crate_suggests_nothing_when_nothing_is_close(registry: DirectoryRegistry) -> None:
    # "echo" is a word of tinyecho's description, but the name is far from it
    with pytest.raises(SearchError) as caught:
        registry.get("echo-words-xyz")
    assert "Did you mean" not in str(caught.value)


def test_get_treats_dash_and_underscore_alike(registry_dir: Path, tmp_path: Path) -> None:
    write_crate(registry_dir, crate("snake_case", files={"src/main.rs": "fn main() {}\n"}))
    opened = DirectoryRegistry(registry_dir, tmp_path / "cache")
    try:
        assert opened.get("snake-case").name == "snake_case"
        assert opened.get("snake_case").name == "snake_case"
    finally:
        opened.close()


def test_get_picks_the_newest_version_by_semver(tmp_path: Path) -> None:
    root = write_registry(tmp_path / "registry", [crate("multi", v) for v in ("0.1.9", "0.1.10", "0.1.3")])
    opened = DirectoryRegistry(root, tmp_path / "cache")
    try:
        assert opened.get("multi").version == "0.1.10"
        assert opened.get("multi", "0.1.3").version == "0.1.3"
        assert sorted(opened.versions("multi")) == ["0.1.10", "0.1.3", "0.1.9"]
        assert opened.can_satisfy("multi", "0.1.5") and not opened.can_satisfy("multi", "0.2")
        assert [(c.name, c.version) for c in opened.search("multi")] == [("multi", "0.1.10")]
        with pytest.raises(SearchError, match=r"0\.1\.10, 0\.1\.3, 0\.1\.9, not 9\.9\.9"):
            opened.get("multi", "9.9.9")
    finally:
        opened.close()


# -- fetch ---------------------------------------------------------------------


def test_fetch_copies_the_crate_without_packaging_files(
    registry: DirectoryRegistry, registry_dir: Path, tmp_path: Path
) -> None:
    source = registry_dir / "tinyecho-0.2.0"
    (source / "debian").mkdir()
    (source / "debian" / "control").write_text("Source: rust-tinyecho\n")
    (source / "tests" / "debian").mkdir(parents=True)  # only the top-level packaging is dropped
    (source / "tests" / "debian" / "case.txt").write_text("kept\n")
    dest = tmp_path / "dest"
    dest.mkdir()
    fetched = registry.fetch(registry.get("tinyecho"), dest)
    copied = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert copied == [
        ".gitignore",
        "Cargo.toml",
        "README.md",
        "data/sample.txt",
        "src/main.rs",
        "tests/debian/case.txt",
    ]
    assert fetched.path == dest
    assert fetched.checksum_kind == "tree-sha256"
    assert fetched.checksum == tree_sha256(dest)
    assert fetched.notes and "no .crate checksum" in fetched.notes[0]


def test_a_vendored_crate_checksum_is_quoted_as_a_claim_never_recorded_as_verified(tmp_path: Path) -> None:
    """A directory registry has no .crate: its .cargo-checksum.json "package" value cannot be checked (A17)."""
    digest = hashlib.sha256(b"a real .crate file").hexdigest()
    spec = crate("vendored", files={"src/main.rs": "fn main() {}\n"}, package_checksum=digest)
    root = write_registry(tmp_path / "registry", [spec])
    fetched = _fetch(root, "vendored", tmp_path)
    assert (fetched.checksum_kind, fetched.checksum) == ("tree-sha256", tree_sha256(tmp_path / "dest"))
    assert any(digest in note and "could not verify" in note for note in fetched.notes), fetched.notes
    assert not (tmp_path / "dest" / ".cargo-checksum.json").exists()


@pytest.mark.parametrize(
    ("listed", "verdict"),
    [
        ({"Cargo.toml": None, "src/main.rs": "fn main() {}\n"}, "Every file matches"),
        ({"Cargo.toml": None, "src/main.rs": "fn main() { evil() }\n"}, "do NOT match"),
        ({"Cargo.toml": None}, "do NOT match"),  # src/main.rs is not listed
    ],
)
def test_the_vendored_per_file_checksums_are_checked_against_the_copy(
    tmp_path: Path, listed: dict[str, str | None], verdict: str
) -> None:
    spec = crate("listed", files={"src/main.rs": "fn main() {}\n"})
    root = write_registry(tmp_path / "registry", [spec])
    crate_dir = next(root.iterdir())
    files = {
        rel: hashlib.sha256(text.encode() if text is not None else (crate_dir / rel).read_bytes()).hexdigest()
        for rel, text in listed.items()
    }
    (crate_dir / ".cargo-checksum.json").write_text(json.dumps({"files": files}))
    fetched = _fetch(root, "listed", tmp_path)
    assert fetched.checksum_kind == "tree-sha256"
    assert any(verdict in note for note in fetched.notes), fetched.notes


def _fetch(root: Path, name: str, tmp_path: Path) -> FetchedSource:
    """``name`` fetched from the directory registry ``root`` into ``tmp_path/dest``."""
    opened = DirectoryRegistry(root, tmp_path / "cache")
    try:
        return opened.fetch(opened.get(name), tmp_path / "dest")
    finally:
        opened.close()


def test_debian_placeholder_checksum_is_not_a_crate_checksum(tmp_path: Path) -> None:
    placeholder = hashlib.sha256(b"0").hexdigest()  # 5feceb66...: what Debian writes when it has none
    spec = crate("placeholder", files={"src/main.rs": "fn main() {}\n"}, package_checksum=placeholder)
    root = write_registry(tmp_path / "registry", [spec])
    assert _fetch(root, "placeholder", tmp_path).checksum_kind == "tree-sha256"


# -- binary targets -------------------------------------------------------------

_MANIFEST = '[package]\nname = "{name}"\nversion = "0.1.0"\nedition = "2021"\n'
_BIN_LAYOUTS = {
    # name: (extra manifest, files, the binaries cargo builds)
    "mainbin": ("", {"src/main.rs": "fn main() {}\n"}, ["mainbin"]),
    "binsdir": (
        "",
        {"src/lib.rs": "", "src/bin/one.rs": "fn main() {}\n", "src/bin/two/main.rs": "fn main() {}\n"},
        ["one", "two"],
    ),
    "declared": (
        '\n[[bin]]\nname = "dtool"\npath = "cli/dtool.rs"\n',
        {"src/lib.rs": "", "cli/dtool.rs": "fn main() {}\n"},
        ["dtool"],
    ),
    "noauto": (
        "autobins = false\n",
        {"src/lib.rs": "", "src/main.rs": "fn main() {}\n", "src/bin/x.rs": "fn main() {}\n"},
        [],
    ),
    "noautodeclared": (
        'autobins = false\n\n[[bin]]\nname = "only"\npath = "src/main.rs"\n',
        {"src/main.rs": "fn main() {}\n", "src/bin/extra.rs": "fn main() {}\n"},
        ["only"],
    ),
    "mainandbins": (
        "",
        {"src/main.rs": "fn main() {}\n", "src/bin/helper.rs": "fn main() {}\n"},
        ["mainandbins", "helper"],
    ),
    "libonly": ("", {"src/lib.rs": "pub fn f() {}\n"}, []),
}


@pytest.fixture
def layouts(tmp_path: Path) -> Iterator[DirectoryRegistry]:
    specs = [
        crate(name, manifest=_MANIFEST.format(name=name) + extra, files=files)
        for name, (extra, files, _) in _BIN_LAYOUTS.items()
    ]
    opened = DirectoryRegistry(write_registry(tmp_path / "registry", specs), tmp_path / "cache")
    yield opened
    opened.close()


@pytest.mark.parametrize("name", sorted(_BIN_LAYOUTS))
def test_binary_targets_are_detected(layouts: DirectoryRegistry, name: str) -> None:
    expected = _BIN_LAYOUTS[name][2]
    candidate = layouts.get(name)
    assert sorted(candidate.bin_names) == sorted(expected)
    assert candidate.has_bin is bool(expected)


@pytest.mark.cargo
def test_binary_targets_agree_with_cargo_metadata(layouts: DirectoryRegistry) -> None:
    for name, (_, _, expected) in _BIN_LAYOUTS.items():
        done = subprocess.run(
            ["cargo", "metadata", "--offline", "--no-deps", "--format-version", "1"],
            cwd=layouts.path / f"{name}-0.1.0",
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "CARGO_TARGET_DIR": str(layouts.index_path.parent / "target")},
        )
        [package] = json.loads(done.stdout)["packages"]
        cargo_bins = sorted(t["name"] for t in package["targets"] if "bin" in t["kind"])
        assert cargo_bins == sorted(expected), name
        assert sorted(layouts.get(name).bin_names) == cargo_bins, name


def test_a_registry_entry_that_links_to_its_crate_is_fetched_and_nothing_inside_is_followed(tmp_path: Path) -> None:
    """An overlay registry links each entry to a crate elsewhere (testing/overlay.py; make bench's): the entry's link
    is the registry's layout, followed once; a link inside the crate stays a link."""
    elsewhere = write_registry(tmp_path / "elsewhere", ["tinyecho"])
    crate = next(p for p in elsewhere.iterdir() if p.name.startswith("tinyecho"))
    (crate / "planted").symlink_to("/etc/passwd")
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / crate.name).symlink_to(crate)
    registry = DirectoryRegistry(overlay, tmp_path / "cache")
    fetched = registry.fetch(registry.get("tinyecho"), tmp_path / "fork")
    assert (tmp_path / "fork" / "Cargo.toml").is_file() and fetched is not None
    assert (tmp_path / "fork" / "planted").is_symlink()  # kept as a link, never read
