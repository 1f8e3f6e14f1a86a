"""The ratchet's test scanner: #[test] functions found in the source, deleted, emptied or ignored ones seen."""

from __future__ import annotations

from pathlib import Path

from flakebot_magic.edit.ratchet import ratchet_violations, scan_tests

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
