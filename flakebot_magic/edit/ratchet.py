"""The ratchet: the crate's ``#[test]`` functions found in the source, and the best state that must not be lost.

Passing tests never go down, and no protected test (one present at the best
commit) may be deleted, emptied or ``#[ignore]``d; the loop reverts a check
run that does either to :attr:`Ratchet.best_commit`.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ..host.fsutil import identity, settled
from ..host.trees import Walk
from ..sandbox.layout import source_dirs
from .files import read_text

__all__ = ["Ratchet", "ScanCache", "TestFunction", "blank", "ratchet_violations", "scan_tests"]

_BLANKABLE = re.compile(
    r'//[^\n]*|/\*.*?\*/|b?r(#*)".*?"\1|b?"(?:\\.|[^"\\])*"|b?\'(?:\\.|[^\'\\])\'',
    re.S,
)
_TEST_FN = re.compile(
    r"#\[\s*(?:[A-Za-z_][\w]*::)*test\s*(?:\([^)]*\))?\s*\]"  # #[test], #[tokio::test(...)]
    r"((?:\s*#\[[^\]]*\])*)"  # more attributes: #[ignore], #[should_panic]
    r"\s*(?:pub(?:\([^)]*\))?\s+)?(?:async\s+)?(?:unsafe\s+)?fn\s+([A-Za-z_]\w*)"
)
_EMPTY_BODIES = {"", "()", "return", "Ok(())", "returnOk(())"}
#: what :func:`scan_tests` found in each file, by relative path, with the file's identity when it was read
ScanCache = dict[str, tuple[tuple[int, ...], list["TestFunction"]]]


def blank(text: str) -> str:
    """Rust source with comments and string literals replaced by spaces (same length), so braces can be counted."""
    return _BLANKABLE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


@dataclass(frozen=True)
class TestFunction:
    """A ``#[test]`` function found in the source."""

    __test__ = False

    name: str
    file: str
    empty: bool
    ignored: bool


def scan_tests(root: Path, cache: ScanCache | None = None) -> list[TestFunction]:
    """Every ``#[test]`` function in the crate's ``.rs`` files (not ``target/``).

    With ``cache``, a file whose :func:`~flakebot_magic.host.fsutil.identity` is the one recorded when
    it was last read is not read again (a rewrite that puts the modification time back still changes
    it); a file changed within :data:`~flakebot_magic.host.fsutil.RACY_SECONDS` of its reading is never cached.
    """
    found: list[TestFunction] = []
    seen: set[str] = set()
    for path in sorted(_rust_files(root)):
        rel = path.relative_to(root).as_posix()
        key: tuple[int, ...] = ()
        if cache is not None:
            try:
                st = os.lstat(path)
            except OSError:
                continue
            key = identity(st)
            known = cache.get(rel)
            if known is not None and known[0] == key:
                found += known[1]
                seen.add(rel)
                continue
        try:
            text = blank(read_text(path))
        except OSError:
            continue
        tests = _tests_in(text, rel)
        found += tests
        if cache is not None and settled(key):
            cache[rel] = (key, tests)
            seen.add(rel)
    if cache is not None:
        for gone in set(cache) - seen:
            del cache[gone]
    return found


def _tests_in(text: str, rel: str) -> list[TestFunction]:
    """The ``#[test]`` functions of one file's blanked text (:func:`blank`)."""
    found: list[TestFunction] = []
    for match in _TEST_FN.finditer(text):
        attributes, name = match.group(1), match.group(2)
        start = text.find("{", match.end())
        if start < 0:
            continue
        depth, end = 0, start
        for end in range(start, len(text)):
            if text[end] == "{":
                depth += 1
            elif text[end] == "}":
                depth -= 1
                if depth == 0:
                    break
        body = re.sub(r"[\s;]", "", text[start + 1 : end])
        found.append(TestFunction(name=name, file=rel, empty=body in _EMPTY_BODIES, ignored="ignore" in attributes))
    return found


def _rust_files(root: Path) -> Iterable[Path]:
    for dirpath, dirnames, filenames in Walk(root):  # an explicit stack: no depth ends it with a RecursionError
        dirnames[:] = source_dirs(dirnames)
        for name in filenames:
            if name.endswith(".rs"):
                yield Path(dirpath) / name


def ratchet_violations(protected: list[TestFunction], now: list[TestFunction]) -> list[str]:
    """What happened to protected tests: deleted, emptied, or newly ignored.

    Tests are counted by name, as deletions are: modules may hold tests of the
    same name (toml's ``from_dotted_table`` in five of them, two ignored
    upstream), and only more empty or ignored ones than before is a change.
    """
    have = Counter(t.name for t in now)
    wanted = Counter(t.name for t in protected)
    problems = [f"deleted test `{name}`" for name, count in sorted(wanted.items()) if have[name] < count]
    for verb, flag in (("emptied", "empty"), ("put #[ignore] on", "ignored")):
        before = Counter(t.name for t in protected if getattr(t, flag))
        after = [t for t in now if getattr(t, flag) and t.name in wanted]
        for name, count in sorted(Counter(t.name for t in after).items()):
            if count > before[name]:
                where = next(t.file for t in after if t.name == name)
                problems.append(f"{verb} test `{name}` ({where})")
    return problems


@dataclass
class Ratchet:
    """The best state so far: its commit, its passing tests, and the tests it protects."""

    root: Path
    best_commit: str = ""
    best_passed: int = 0
    protected: list[TestFunction] = field(default_factory=list)
    #: what the last scans found per file (:func:`scan_tests`): a check run reads only the files that changed
    scanned: ScanCache = field(default_factory=dict, repr=False)

    def protect(self) -> None:
        """Protect every test in the source as it is now."""
        self.protected = scan_tests(self.root, self.scanned)

    def violations(self) -> list[str]:
        """What the source as it is now did to the protected tests."""
        return ratchet_violations(self.protected, scan_tests(self.root, self.scanned))

    def advance(self, commit: str, passed: int) -> None:
        """``commit`` is the new best state (with ``passed`` passing tests); its tests are protected."""
        self.best_commit, self.best_passed = commit, passed
        self.protect()

    def hint(self) -> str:
        """Where the best state is, for an error message."""
        return (
            f"\nThe best state is commit {self.best_commit[:12]} ({self.best_passed} tests passing): "
            f"`git -C {self.root} log` shows every check run."
        )
