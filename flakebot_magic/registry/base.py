"""The interface every crate registry backend implements, and what it returns."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..errors import RegistryError
from ..untrusted import make_fields_safe

__all__ = [
    "MAX_SOURCE_BYTES",
    "MAX_SOURCE_FILES",
    "BuildsAnIndex",
    "CrateCandidate",
    "FetchedSource",
    "Registry",
    "ResolvesLocally",
    "SearchesByMeaning",
    "check_crate_field",
]

#: the most bytes one crate's published source may hold, unpacked (crates.io refuses crates over 10 MB packed)
MAX_SOURCE_BYTES = 256 * 1024 * 1024
#: the most files one crate's published source may hold
MAX_SOURCE_FILES = 50_000

#: what a crate name, a version and a binary's name may be: each becomes a path component (a workspace, a store
#: entry, ``name-version/`` in an archive, a deployed binary) or a command's argument
_FIELD_RULES = {
    "name": (re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}"), "1 to 64 ASCII letters, digits, '-' or '_'"),
    "version": (
        re.compile(r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}"),
        "1 to 64 ASCII letters, digits, '.', '+', '-' or '_' (semver: 1.2.3-pre+build)",
    ),
    "binary": (re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,63}"), "1 to 64 ASCII letters, digits, '_', '.', '+', '-'"),
}


def check_crate_field(kind: str, value: object) -> str:
    """``value`` if it is a valid crate ``name``, ``version`` or ``binary`` name; else RegistryError.

    The one validator for what a registry or a crate says that becomes a path
    or a name: no ``/``, no ``..``, no leading ``-`` or ``.``, no control
    character, at most 64 characters.

    >>> check_crate_field("version", "1.0.0-beta.2+git")
    '1.0.0-beta.2+git'
    >>> check_crate_field("version", "0.1.0/../../tmp")  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    ...
    RegistryError: the registry gives the version '0.1.0/../../tmp', which is not ...
    """
    pattern, rule = _FIELD_RULES[kind]
    if not isinstance(value, str) or not pattern.fullmatch(value) or ".." in value:
        raise RegistryError(
            f"the registry gives the {kind} {value!r}, which is not one: a {kind} is {rule}. "
            "The registry's data is malformed or hostile; choose another crate or registry."
        )
    return value


@dataclass(frozen=True)
class CrateCandidate:
    """One crate at one exact version, as a registry describes it.

    ``score`` is higher-is-better and only comparable within one search.
    ``checksum`` is the sha256 of the published ``.crate`` file when the
    registry knows it (crates.io does; Debian's directory registry does not).

    Everything in it is what a crate's author wrote: its name, version and
    binaries' names are checked when it is made (:func:`check_crate_field`:
    a RegistryError otherwise), its text is made safe to show (:func:`flakebot_magic.untrusted.make_fields_safe`;
    one line each, but the description).
    """

    name: str
    version: str
    description: str = ""
    score: float = 0.0
    has_bin: bool = False
    bin_names: tuple[str, ...] = ()
    #: a binary's sources read standard input (it can be handed text); directory registries know it
    reads_stdin: bool = False
    #: what its binaries read, as their sources show: ``stdin``, ``args``, ``file`` or ``none``
    #: (:func:`~flakebot_magic.registry.crate_files.binary_input`); "" when the registry cannot tell
    reads: str = ""
    keywords: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    license: str = ""
    homepage: str = ""
    repository: str = ""
    registry: str = ""
    checksum: str | None = None
    #: why ``score`` is what it is: its factors (``relevance``, ``prior``, ``popularity``,
    #: ``name``, ``coverage``, ``bin``, ``term``) and ``evidence`` (the share of the request
    #: its own words cover), as far as the registry and the ranking know them
    parts: dict[str, float] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        check_crate_field("name", self.name)
        check_crate_field("version", self.version)
        for binary in self.bin_names:
            check_crate_field("binary", binary)
        make_fields_safe(
            self,
            lines=("name", "version", "bin_names", "keywords", "categories", "license", "homepage", "repository"),
        )

    @property
    def id(self) -> str:
        return f"{self.name}@{self.version}"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["bin_names"] = list(self.bin_names)
        data["keywords"] = list(self.keywords)
        data["categories"] = list(self.categories)
        data["parts"] = dict(self.parts)
        return data


@dataclass(frozen=True)
class FetchedSource:
    """A crate's published source unpacked into ``path``.

    ``checksum`` is the sha256 of the ``.crate`` archive when it was
    downloaded, else the sha256 of the unpacked file tree (``checksum_kind``
    says which).
    """

    path: Path
    checksum: str
    checksum_kind: str = "crate-sha256"
    notes: tuple[str, ...] = field(default=())


@runtime_checkable
class Registry(Protocol):
    """A source of published crates: search them, fetch one, tell cargo where they are."""

    #: a short stable identifier, e.g. ``dir:/usr/share/cargo/registry`` or ``crates.io``
    id: str
    #: True when cargo must run ``--offline`` against :meth:`cargo_config`
    offline: bool

    def search(self, query: str, limit: int = 10) -> list[CrateCandidate]:
        """Candidates for a free-text query, best first."""
        ...

    def get(self, name: str, version: str | None = None) -> CrateCandidate:
        """One crate by name (newest version unless given); raises SearchError."""
        ...

    def fetch(self, candidate: CrateCandidate, dest: Path) -> FetchedSource:
        """Unpack the published source of ``candidate`` into the empty directory ``dest``."""
        ...

    def cargo_config(self) -> str:
        """TOML for ``.cargo/config.toml`` that makes cargo resolve from this registry
        (empty when cargo's default, crates.io, is right)."""
        ...


@runtime_checkable
class BuildsAnIndex(Protocol):
    """A registry that searches an index it must build first (a directory source: :mod:`.shared_index`)."""

    def index_ready(self) -> bool:
        """Whether the index is built already: a search starts at once."""
        ...

    def prepare_index(self, progress: Callable[[int, int], None] | None = None) -> None:
        """Build the index when none is built, telling ``progress`` ``(done, total)`` as it goes."""
        ...


@runtime_checkable
class ResolvesLocally(Protocol):
    """A registry that can say, without cargo, whether it holds a version matching a requirement (a directory source)."""

    id: str

    def can_satisfy(self, name: str, requirement: str) -> bool:
        """Whether some version of ``name`` in this registry matches ``requirement`` (cargo's rules)."""
        ...


@runtime_checkable
class SearchesByMeaning(Protocol):
    """A registry whose search can rank by meaning (sentence embeddings) as well as by words."""

    #: why its search ranks by words only, and how to change that ("" when meaning counts too)
    semantic_off: str
