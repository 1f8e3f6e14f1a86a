"""What the registry offers: ``search`` (ranked crates), ``catalog`` (what builds with no model) and ``index``.

``flakebot catalog [WORDS]`` and ``%flakebot catalog [WORDS]`` list the
registry's crates whose own binary is a tool as published (it takes text:
standard input or its arguments), so a newcomer sees what can be built before
any model is configured; each with one line and a ready ``%%flakebot`` cell.
``flakebot index`` builds the registry's search index ahead (``--system``: the
machine's, as root, for every user), which ``make install`` runs.
"""

from __future__ import annotations

import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..commands import typed
from ..config import Settings
from ..errors import ConfigError, UsageError
from ..host.names import tool_name
from ..registry.base import CrateCandidate
from ..stages.search import indexing, open_registry, search, tools_of, viewer, why, words_only
from ..untrusted import safe_line
from .tools import SEARCH_WIDTH, CommandResult

__all__ = ["CATALOG_LIMIT", "CatalogEntry", "build_index", "catalog", "search_crates"]

#: how many crates a catalog lists at most (a registry of 1,000 crates ships about 60 binaries)
CATALOG_LIMIT = 200

#: the most characters of a crate's description a catalog cell's request quotes (its first sentence)
REQUEST_ABOUT = 80


def search_crates(
    settings: Settings, query: str, *, limit: int = 10, say: Callable[[str], None] | None = None
) -> CommandResult:
    """``search QUERY``: ranked crate candidates in ``settings``' registry; why each scores what it does.

    Without a match the text is empty and a note says so. ``say`` is told,
    while it waits, that the registry's index is being built (the first search
    on this machine), with its progress.
    """
    registry = open_registry(settings.registry, settings.cache_dir, settings.embedding_model)
    if say is not None:
        indexing(registry, say)
    found = search(registry, query, limit=limit)
    notes = (words_only(registry),) if words_only(registry) else ()
    if not found:
        return CommandResult([], "", (*notes, f"No crate matches {query!r}."))
    width = max(len(f"{c.name} {c.version}") for c in found)
    lines = []
    for c in found:
        # a crate per block at a normal terminal's width: its line, its description and why, wrapped under it
        lines.append(f"{c.score:6.2f}  {f'{c.name} {c.version}':<{width}}  {'bin' if c.has_bin else 'lib'}")
        for text in (c.description, f"why: {why(c)}"):
            lines += textwrap.wrap(
                " ".join(safe_line(text).split()), SEARCH_WIDTH, initial_indent=" " * 8, subsequent_indent=" " * 8
            )
    return CommandResult([c.to_json() for c in found], "\n".join(lines), notes)


@dataclass(frozen=True)
class CatalogEntry:
    """A crate whose binary builds as a tool with no model: what it is, and the cell that builds it."""

    crate: str
    version: str
    binary: str
    reads: str
    description: str
    viewer: bool

    @property
    def request(self) -> str:
        """What the cell asks for: the binary as published, what it reads, and the crate's first sentence.

        Not the crate's description alone: that describes a crate (often a library: "a cross-platform library
        for opening OS pipes", whose binary is ``cat``), can run to a paragraph, and is what a model, once one is
        configured, would be asked to make of the fork. The request says the tool is the binary, unchanged.
        """
        takes = "reads standard input" if self.reads == "stdin" else "takes its arguments"
        about = " ".join(safe_line(self.description).split())
        first = about.split(". ", 1)[0].rstrip(".")
        if len(first) > REQUEST_ABOUT:
            first = first[: REQUEST_ABOUT - 1].rsplit(" ", 1)[0] + "…"
        said = f" ({self.crate}: {first})" if first else f" (from the crate {self.crate})"
        return f"The {self.binary} command as published, which {takes}{said}."

    @property
    def cell(self) -> str:
        """A ``%%flakebot`` cell that builds it: its crate named (no search), :attr:`request` as the request."""
        return f"%%flakebot --name {tool_name(self.crate)} --crate {self.crate}\n{self.request}"

    def line(self) -> str:
        takes = "reads standard input" if self.reads == "stdin" else "takes its arguments"
        kind = ", a viewer (its output is for reading)" if self.viewer else ""
        return f"{self.crate} {self.version}: binary {self.binary}, {takes}{kind}"


def _entry(candidate: CrateCandidate) -> CatalogEntry | None:
    tools = tools_of(candidate)
    if not tools or candidate.reads not in ("stdin", "args"):
        return None  # no tool, or one that reads only files or nothing: not deployable from a request as published
    return CatalogEntry(
        candidate.name, candidate.version, tools[0], candidate.reads, candidate.description, viewer(candidate)
    )


def catalog(settings: Settings, words: str = "", *, say: Callable[[str], None] | None = None) -> CommandResult:
    """``catalog [WORDS]``: the registry's crates whose binary builds as a tool with no model, each with a cell.

    With ``words``, those the registry's search finds for them, best first;
    without, all of them by name. ``say`` is told of an index being built.
    """
    registry = open_registry(settings.registry, settings.cache_dir, settings.embedding_model)
    binaries = getattr(registry, "binaries", None)
    if binaries is None:
        raise ConfigError(
            f"The catalog lists a directory registry's binaries; {registry.id} is searched remotely. Use "
            f"{typed('search WORDS')} there, or give --registry a directory (Debian's /usr/share/cargo/registry)."
        )
    if say is not None:
        indexing(registry, say)
    entries = {e.crate: e for e in (_entry(c) for c in binaries()) if e is not None}
    if words.strip():
        found = search(registry, words, limit=CATALOG_LIMIT, prefer_bin=True)
        shown = [entries[c.name] for c in found if c.name in entries]
    else:
        shown = list(entries.values())
    shown = shown[:CATALOG_LIMIT]
    if not shown:
        about = f" for {words!r}" if words.strip() else ""
        return CommandResult(
            [],
            "",
            (
                f"No binary in {registry.id.removeprefix('dir:')} builds as a tool{about} without a model. Try "
                "other words, or configure a model (--model NAME, with --provider or --base-url): it turns a "
                "library into a tool.",
            ),
        )
    what = f" for {words!r}" if words.strip() else ""
    many = len(shown) != 1
    head = (
        f"{len(shown)} crate{'s' if many else ''} in {registry.id.removeprefix('dir:')}{what} build{'' if many else 's'}"
        " a tool with no model (a crate's own binary, as published). Each with the cell that builds it:"
    )
    blocks = [head]
    for entry in shown:  # its line, then its cell as it is typed
        blocks.append(f"\n# {entry.line()}\n{entry.cell}")
    data = [{**e.__dict__, "cell": e.cell} for e in shown]
    return CommandResult(data, "\n".join(blocks))


def build_index(settings: Settings, *, system: bool = False, say: Callable[[str], None] | None = None) -> CommandResult:
    """``index [--system]``: build the registry's search index now, into the user's place or (``system``, as
    root) the machine's, which every user reads; what ``make install`` runs, so no first search waits."""
    from ..registry.directory import DirectoryRegistry
    from ..registry.shared_index import SYSTEM_INDEX_DIR, make_system_place, user_index_dir, writable_place

    registry = open_registry(settings.registry, settings.cache_dir, settings.embedding_model)
    if not isinstance(registry, DirectoryRegistry):
        raise UsageError(f"{registry.id} has no index of flakebot's to build: only a directory registry has one.")
    if system:
        try:
            place: Path | None = make_system_place(SYSTEM_INDEX_DIR)
        except OSError as exc:
            raise UsageError(
                f"The machine's index directory {SYSTEM_INDEX_DIR} cannot be written ({exc}): run "
                f"{typed('index --system')} as root, or {typed('index')} for your own."
            ) from None
    else:
        user = user_index_dir()
        place = writable_place([user] if user is not None else [], system=SYSTEM_INDEX_DIR)
        place = place or writable_place(registry.index.places, system=SYSTEM_INDEX_DIR)
    if place is None:
        raise UsageError("No place to keep the index can be written here: check that your home is writable.")
    started, shown = time.monotonic(), [-1]

    def progress(done: int, total: int) -> None:
        tenth = 10 * done // max(total, 1)
        if say is not None and tenth > shown[0]:
            shown[0] = tenth
            say(f"indexing {registry.path}: {10 * tenth}%")

    path = registry.build_index(place, progress)
    crates = len(registry.binaries())
    registry.close()
    seconds = time.monotonic() - started
    text = (
        f"indexed {registry.path} for search into {path} in {seconds:.1f} s ({crates} crates ship a binary); "
        f"{'every user' if system else 'every cache dir of yours'} now searches it without waiting"
    )
    return CommandResult({"path": str(path), "registry": str(registry.path), "seconds": seconds}, text)
