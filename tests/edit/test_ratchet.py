"""The ratchet's test scanner: #[test] functions found in the source, deleted, emptied or ignored ones seen."""

from __future__ import annotations

import os
import time
from pathlib import Path

from flakebot_magic.edit.ratchet import ScanCache, ratchet_violations, scan_tests
from flakebot_magic.host.fsutil import RACY_SECONDS

RUST_WITH_TESTS = """
fn add(a: u32, b: u32) -> u32 { a + b }

// #[test] fn commented_out() {}
const NOT_A_TEST: &str = "#[test] fn in_a_string() { }";

#[cfg(test)]
mod tests {
    #[test]
    fn adds() {
        assert_eq!(super::add(1, 2), 3); // {{ braces in a comment
    }

    #[test]
    #[should_panic]
    fn panics() { let s = "}"; panic!("{}", s); }

    #[tokio::test]
    async fn later() { assert!(true); }
}
"""


def test_scan_tests_finds_test_functions_not_comments_or_strings(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "lib.rs").write_text(RUST_WITH_TESTS)
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "gen.rs").write_text("#[test]\nfn generated() {}\n")
    found = {t.name: t for t in scan_tests(tmp_path)}
    assert set(found) == {"adds", "panics", "later"}
    assert not any(t.empty or t.ignored for t in found.values())


def test_the_ratchet_sees_deleted_emptied_and_ignored_tests(tmp_path: Path) -> None:
    (tmp_path / "lib.rs").write_text(RUST_WITH_TESTS)
    before = scan_tests(tmp_path)
    assert ratchet_violations(before, before) == []
    changed = (
        RUST_WITH_TESTS.replace("assert_eq!(super::add(1, 2), 3); // {{ braces in a comment", "// nothing")
        .replace("#[should_panic]", "#[should_panic]\n    #[ignore]")
        .replace("async fn later() { assert!(true); }", "async fn renamed() { assert!(true); }")
    )
    (tmp_path / "lib.rs").write_text(changed)
    problems = ratchet_violations(before, scan_tests(tmp_path))
    assert problems == [
        "deleted test `later`",
        "emptied test `adds` (lib.rs)",
        "put #[ignore] on test `panics` (lib.rs)",
    ]


def test_tests_of_the_same_name_in_several_modules_are_counted_not_confused(tmp_path: Path) -> None:
    # toml 0.5 has `from_dotted_table` in five modules, two of them ignored upstream: no change is no violation
    ignore = "    #[ignore]\n"
    modules = "".join(
        f"mod m{i} {{\n    #[test]\n{ignore if i in (2, 4) else ''}    fn same() {{ assert!(true); }}\n}}\n"
        for i in range(5)
    )
    (tmp_path / "lib.rs").write_text(modules)
    before = scan_tests(tmp_path)
    assert ratchet_violations(before, before) == []
    # a third one ignored is a violation; one of the ignored ones deleted is a deletion
    (tmp_path / "lib.rs").write_text(
        modules.replace("mod m0 {\n    #[test]\n", "mod m0 {\n    #[test]\n    #[ignore]\n")
    )
    assert ratchet_violations(before, scan_tests(tmp_path)) == ["put #[ignore] on test `same` (lib.rs)"]
    (tmp_path / "lib.rs").write_text(
        modules.replace("mod m4 {\n    #[test]\n    #[ignore]\n    fn same() { assert!(true); }\n}\n", "")
    )
    assert ratchet_violations(before, scan_tests(tmp_path)) == ["deleted test `same`"]


def _aged(path: Path, seconds: float = 60.0) -> None:
    """Set ``path``'s modification time back, as a file written a while ago (its ctime is now, as always)."""
    old = time.time() - seconds
    os.utime(path, (old, old))


def test_the_scan_reads_again_every_file_that_changed_even_with_its_times_put_back(tmp_path: Path) -> None:
    """The cache of a check run's scans is keyed by what no code can forge: a rewrite keeping the size and
    putting the modification time back still changes the ctime, so the ratchet sees the deleted test."""
    lib = tmp_path / "src" / "lib.rs"
    lib.parent.mkdir()
    lib.write_text("#[test]\nfn kept() { assert!(true); }\n")
    cache: ScanCache = {}
    time.sleep(RACY_SECONDS + 0.2)  # older than the racy window: cached
    assert [t.name for t in scan_tests(tmp_path, cache)] == ["kept"] and "src/lib.rs" in cache
    assert [t.name for t in scan_tests(tmp_path, cache)] == ["kept"]  # from the cache
    before = os.stat(lib)
    lib.write_text("#[test]\nfn gone() { assert!(true); }\n")  # the same size
    os.utime(lib, ns=(before.st_atime_ns, before.st_mtime_ns))  # and the same modification time
    assert os.stat(lib).st_size == before.st_size and os.stat(lib).st_mtime_ns == before.st_mtime_ns
    assert [t.name for t in scan_tests(tmp_path, cache)] == ["gone"]
    assert ratchet_violations(scan_tests(tmp_path), scan_tests(tmp_path, cache)) == []


def test_a_file_changed_just_now_is_never_cached_and_a_removed_one_is_forgotten(tmp_path: Path) -> None:
    lib = tmp_path / "src" / "lib.rs"
    lib.parent.mkdir()
    lib.write_text("#[test]\nfn fresh() {}\n")
    cache: ScanCache = {}
    assert [t.name for t in scan_tests(tmp_path, cache)] == ["fresh"] and cache == {}  # its ctime is now
    lib.unlink()
    (tmp_path / "src" / "other.rs").write_text("#[test]\nfn other() { assert!(true); }\n")
    _aged(tmp_path / "src" / "other.rs")
    assert [t.name for t in scan_tests(tmp_path, cache)] == ["other"] and cache == {}  # ctime still now
    assert scan_tests(tmp_path, cache) == scan_tests(tmp_path)
