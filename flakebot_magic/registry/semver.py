"""Cargo's version requirements, enough to ask "can this registry satisfy that?".

Implements cargo's rules for ``^`` (the default), ``~``, ``=``, ``>``,
``>=``, ``<``, ``<=``, wildcards and comma-joined requirements. Pre-release
versions only match requirements that name a pre-release of the same
``major.minor.patch``, as in cargo.
"""

from __future__ import annotations

import re

__all__ = ["Version", "matches", "newest"]

_VERSION = re.compile(
    r"^\s*v?(\d+)(?:\.(\d+|\*|x|X))?(?:\.(\d+|\*|x|X))?(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?\s*$"
)


class Version:
    """A parsed semver version, ordered as cargo orders them."""

    __slots__ = ("major", "minor", "patch", "pre")

    def __init__(self, text: str) -> None:
        match = _VERSION.match(text)
        if not match or match.group(2) in (None, "*", "x", "X") or match.group(3) in (None, "*", "x", "X"):
            raise ValueError(f"not a version: {text!r}")
        self.major, self.minor, self.patch = (int(match.group(i)) for i in (1, 2, 3))
        self.pre = tuple(match.group(4).split(".")) if match.group(4) else ()

    def _key(self) -> tuple[int, int, int, int, tuple[tuple[int, int | str], ...]]:
        pre = tuple((0, int(p)) if p.isdigit() else (1, p) for p in self.pre)
        return (self.major, self.minor, self.patch, 0 if self.pre else 1, pre)

    def __lt__(self, other: Version) -> bool:
        return self._key() < other._key()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Version) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        pre = "-" + ".".join(self.pre) if self.pre else ""
        return f"Version('{self.major}.{self.minor}.{self.patch}{pre}')"


def _comparator(text: str) -> list[tuple[str, Version]]:
    """One comparator like ``^1.2`` as a list of (operator, bound) pairs."""
    text = text.strip()
    op_match = re.match(r"^(\^|~|=|>=|<=|>|<)?\s*(.*)$", text)
    assert op_match is not None
    op, rest = op_match.group(1) or "^", op_match.group(2)
    if rest in ("*", "x", "X", ""):
        return []
    match = _VERSION.match(rest)
    if not match:
        raise ValueError(f"not a version requirement: {text!r}")
    major = int(match.group(1))
    minor_s, patch_s = match.group(2), match.group(3)
    minor = None if minor_s in (None, "*", "x", "X") else int(minor_s)
    patch = None if patch_s in (None, "*", "x", "X") else int(patch_s)
    pre = "-" + match.group(4) if match.group(4) else ""

    def v(a: int, b: int, c: int, with_pre: bool = False) -> Version:
        return Version(f"{a}.{b}.{c}{pre if with_pre else ''}")

    low = v(major, minor or 0, patch or 0, with_pre=True)
    if op == "=":
        if minor is None:
            return [(">=", low), ("<", v(major + 1, 0, 0))]
        if patch is None:
            return [(">=", low), ("<", v(major, minor + 1, 0))]
        return [("=", low)]
    if op in (">", ">=", "<", "<="):
        if op == ">" and (minor is None or patch is None):
            upper = v(major + 1, 0, 0) if minor is None else v(major, minor + 1, 0)
            return [(">=", upper)]
        if op == "<=" and (minor is None or patch is None):
            upper = v(major + 1, 0, 0) if minor is None else v(major, minor + 1, 0)
            return [("<", upper)]
        return [(op, low)]
    if op == "~":
        if minor is None:
            return [(">=", low), ("<", v(major + 1, 0, 0))]
        return [(">=", low), ("<", v(major, minor + 1, 0))]
    if minor_s in ("*", "x", "X") or patch_s in ("*", "x", "X"):
        # a wildcard pins what it names: 1.* is <2.0.0, 1.2.* is <1.3.0
        return [(">=", low), ("<", v(major + 1, 0, 0) if minor is None else v(major, minor + 1, 0))]
    # caret: the default
    if major > 0 or minor is None:
        upper = v(major + 1, 0, 0)
    elif minor > 0 or patch is None:
        upper = v(0, minor + 1, 0)
    else:
        upper = v(0, 0, (patch or 0) + 1)
    return [(">=", low), ("<", upper)]


def matches(requirement: str, version: str) -> bool:
    """True when ``version`` satisfies cargo requirement ``requirement``.

    >>> matches("1.3", "1.4.0"), matches("0.2", "0.3.0"), matches("~1.2", "1.2.9")
    (True, False, True)
    """
    try:
        candidate = Version(version)
        pairs = [pair for part in requirement.split(",") for pair in _comparator(part)]
    except ValueError:
        return False
    if candidate.pre and not any(
        bound.pre and (bound.major, bound.minor, bound.patch) == (candidate.major, candidate.minor, candidate.patch)
        for _, bound in pairs
    ):
        return False
    for op, bound in pairs:
        ok = {
            "=": candidate == bound,
            ">": bound < candidate,
            ">=": not candidate < bound,
            "<": candidate < bound,
            "<=": not bound < candidate,
        }[op]
        if not ok:
            return False
    return True


def newest(versions: list[str]) -> str:
    """The highest of ``versions`` by semver order (unparseable ones sort first)."""

    def key(text: str) -> tuple[int, Version | None]:
        try:
            return (1, Version(text))
        except ValueError:
            return (0, None)

    return max(versions, key=lambda t: (key(t)[0], key(t)[1] or Version("0.0.0")))
