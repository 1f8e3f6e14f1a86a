"""Cargo's version requirements, case by case from the Cargo Book's "Specifying Dependencies"."""

from __future__ import annotations

import pytest

from flakebot_magic.registry.semver import Version, matches, newest

# (requirement, versions that match, versions that do not)
CASES = [
    # caret, the default: changes that do not modify the left-most non-zero part
    ("1.2.3", ["1.2.3", "1.2.4", "1.9.0"], ["1.2.2", "2.0.0", "0.9.0"]),
    ("^1.2.3", ["1.2.3", "1.99.99"], ["1.2.2", "2.0.0"]),
    ("^1.2", ["1.2.0", "1.9.9"], ["1.1.9", "2.0.0"]),
    ("^1", ["1.0.0", "1.99.0"], ["0.9.9", "2.0.0"]),
    ("^0.2.3", ["0.2.3", "0.2.9"], ["0.2.2", "0.3.0"]),
    ("^0.2", ["0.2.0", "0.2.9"], ["0.1.9", "0.3.0"]),
    ("^0.0.3", ["0.0.3"], ["0.0.2", "0.0.4", "0.1.0"]),
    ("^0.0", ["0.0.0", "0.0.9"], ["0.1.0"]),
    ("^0", ["0.0.0", "0.9.9"], ["1.0.0"]),
    ("0.1", ["0.1.0", "0.1.3"], ["0.2.0", "0.0.9"]),
    # tilde: a minimal version with some ability to update
    ("~1.2.3", ["1.2.3", "1.2.9"], ["1.2.2", "1.3.0"]),
    ("~1.2", ["1.2.0", "1.2.9"], ["1.1.9", "1.3.0"]),
    ("~1", ["1.0.0", "1.9.9"], ["0.9.9", "2.0.0"]),
    ("~0.2", ["0.2.0", "0.2.5"], ["0.3.0"]),
    # wildcards
    ("*", ["0.0.0", "1.2.3", "99.0.0"], []),
    ("1.*", ["1.0.0", "1.9.9"], ["0.9.9", "2.0.0"]),
    ("0.*", ["0.0.1", "0.9.9"], ["1.0.0"]),
    ("0.2.*", ["0.2.0", "0.2.9"], ["0.3.0"]),
    # comparisons
    (">= 1.2.0", ["1.2.0", "5.0.0"], ["1.1.9"]),
    ("> 1", ["2.0.0"], ["1.0.0", "1.9.9"]),
    (">1.2", ["1.3.0"], ["1.2.0", "1.2.9"]),
    (">1.2.3", ["1.2.4"], ["1.2.3"]),
    ("< 2", ["1.9.9"], ["2.0.0"]),
    ("<1.2", ["1.1.9"], ["1.2.0"]),
    ("<=1.2", ["1.2.9"], ["1.3.0"]),
    ("<=1.2.3", ["1.2.3"], ["1.2.4"]),
    ("= 1.2.3", ["1.2.3"], ["1.2.4", "1.2.2"]),
    ("=1.2", ["1.2.0", "1.2.9"], ["1.3.0"]),
    ("=1", ["1.0.0", "1.9.0"], ["2.0.0"]),
    # several requirements, comma-separated
    (">= 1.2, < 1.5", ["1.2.0", "1.4.9"], ["1.1.9", "1.5.0"]),
    (">=0.1.0, <0.1.3", ["0.1.2"], ["0.1.3"]),
    # build metadata is ignored
    ("1.2.3", ["1.2.3+build.5"], []),
]

# pre-releases match only a requirement that names a pre-release of the same major.minor.patch
PRERELEASE_CASES = [
    (
        "^1.2.3-alpha.1",
        ["1.2.3-alpha.1", "1.2.3-alpha.2", "1.2.3-beta", "1.2.3", "1.3.0"],
        ["1.2.3-alpha.0", "1.3.0-alpha", "2.0.0"],
    ),
    (">=1.0.0", ["1.0.0"], ["1.1.0-beta", "2.0.0-rc.1"]),
    ("*", [], ["1.0.0-alpha"]),
    ("1", [], ["1.0.1-rc.1"]),
    ("=1.0.0-rc.1", ["1.0.0-rc.1"], ["1.0.0-rc.2", "1.0.0"]),
    ("~1.2.3-beta", ["1.2.3-beta", "1.2.3-beta.2", "1.2.3", "1.2.9"], ["1.2.3-alpha", "1.2.4-beta", "1.3.0"]),
    ("<1.2.3-beta", ["1.2.3-alpha", "1.2.2"], ["1.2.3-beta", "1.2.3"]),
]


def _expand(cases: list[tuple[str, list[str], list[str]]]) -> list[tuple[str, str, bool]]:
    return [(req, v, True) for req, yes, _ in cases for v in yes] + [
        (req, v, False) for req, _, no in cases for v in no
    ]


@pytest.mark.parametrize(("requirement", "version", "expected"), _expand(CASES))
def test_requirement(requirement: str, version: str, expected: bool) -> None:
    assert matches(requirement, version) is expected


@pytest.mark.parametrize(("requirement", "version", "expected"), _expand(PRERELEASE_CASES))
def test_prerelease_requirement(requirement: str, version: str, expected: bool) -> None:
    assert matches(requirement, version) is expected


@pytest.mark.parametrize("requirement", ["1.2.*", "1.2.x"])
def test_minor_wildcard_stays_within_the_minor(requirement: str) -> None:
    assert matches(requirement, "1.2.7")
    assert not matches(requirement, "1.3.0")


@pytest.mark.parametrize(
    ("requirement", "version"), [("not a version", "1.0.0"), ("^1.0", "1.0"), ("^1.0", "banana"), (">=", "1.0.0x")]
)
def test_nonsense_never_matches(requirement: str, version: str) -> None:
    assert matches(requirement, version) is False


def test_version_order_follows_semver() -> None:
    # the Semantic Versioning spec, item 11
    ordered = [
        "1.0.0-alpha",
        "1.0.0-alpha.1",
        "1.0.0-alpha.beta",
        "1.0.0-beta",
        "1.0.0-beta.2",
        "1.0.0-beta.11",
        "1.0.0-rc.1",
        "1.0.0",
        "1.0.1",
        "1.1.0",
        "1.10.0",
        "2.0.0",
    ]
    versions = [Version(v) for v in ordered]
    assert sorted(reversed(versions)) == versions
    assert Version("1.2.3+build.1") == Version("1.2.3")


@pytest.mark.parametrize("text", ["1", "1.2", "1.2.*", "", "one.two.three"])
def test_incomplete_versions_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="not a version"):
        Version(text)


def test_newest_is_by_semver_not_by_text() -> None:
    assert newest(["0.1.9", "0.1.10", "0.1.3"]) == "0.1.10"
    assert newest(["1.0.0-rc.1", "0.9.0"]) == "1.0.0-rc.1"
    assert newest(["1.0.0", "1.0.0-rc.1"]) == "1.0.0"
    assert newest(["garbage", "0.0.1"]) == "0.0.1"
