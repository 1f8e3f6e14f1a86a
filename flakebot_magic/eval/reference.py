"""``--reference``: each task's reference solution applied through the edit loop, in place of a model.

A reference run proves a suite and the harness together: every task that can
run here must pass with its reference solution, through the same pipeline a
model's attempt goes through (fork, the edit loop's check runs, build,
deploy, the hidden checks). The solution is sent as a model would send it,
by the fake OpenAI-compatible server (a test double, :mod:`.replay`): one
reply writes the reference's files and adds its manifest entries, then runs
the checks; the next one finishes.

The reference's ``Cargo.toml`` is a set of additions (the tool contract,
dependencies), not a manifest: the fork may already have changed the crate's
(a dev-dependency the registry lacks is dropped), so the additions are sent
as ``replace_in_file`` edits anchored on table headers (:func:`manifest_edits`),
as a model would write them, and never as a whole new file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tomlkit

from ..host.fsutil import load_json, load_toml, read_inside
from ..registry.base import Registry
from ..sandbox.manifest import DEPENDENCY_TABLES
from .task import MAX_FILE_BYTES, Task

__all__ = ["ReferenceError", "manifest_edits", "merged", "reference_script", "starting_manifest"]


class ReferenceError(ValueError):
    """A reference solution that cannot be applied as written; the message says why."""


def merged(doc: Mapping[str, Any], additions: Mapping[str, Any]) -> dict[str, Any]:
    """``doc`` with ``additions`` laid over it, table by table (what :func:`manifest_edits` must amount to)."""
    out = dict(doc)
    for key, value in additions.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def _header(path: tuple[str, ...]) -> str:
    """``[a.b."c d"]``: the header of the table ``path``, each key quoted as TOML needs."""
    return "[" + ".".join(tomlkit.key(part).as_string() for part in path) + "]"


def _table_text(path: tuple[str, ...], value: Mapping[str, Any]) -> str:
    """``value`` as the TOML table ``path`` (its sub-tables with their full dotted headers)."""
    document = tomlkit.document()
    current: Any = document
    for part in path[:-1]:
        inner = tomlkit.table(is_super_table=True)
        current.add(part, inner)
        current = inner
    current.add(path[-1], value)
    return tomlkit.dumps(document).strip() + "\n"


def _line(key: str, value: Any) -> str:
    document = tomlkit.document()
    document.add(key, value)
    return tomlkit.dumps(document)


def manifest_edits(text: str, additions: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The ``replace_in_file`` edits (search, replace) that add ``additions`` to the manifest ``text``.

    A table the manifest lacks is written whole, before its ``[package]``
    header; a key of a table it has goes under that table's header (a
    dependency whose table has no header of its own becomes its own
    ``[dependencies.NAME]`` table). A key it already has with the same value
    is left; with another value it is a :class:`ReferenceError`, as is
    anything the edits cannot place. The edits are checked before they are
    returned: applied in order, each ``search`` found exactly once, they give
    :func:`merged` of the manifest and ``additions``.

    >>> edits = manifest_edits('[package]\\nname = "a"\\n\\n[dependencies]\\nx = "1"\\n',
    ...                        {"dependencies": {"y": "2"}, "package": {"metadata": {"flakebot": {"kind": "cli"}}}})
    >>> [search for search, _ in edits]
    ['[dependencies]\\n', '[package]\\n']
    """
    try:
        doc = load_toml(text)
    except ValueError as exc:
        raise ReferenceError(f"the crate's Cargo.toml is not valid TOML: {exc}") from None
    under: dict[tuple[str, ...], list[str]] = {}
    tables: list[str] = []
    # what the edits add, as TOML data: a dependency given as a version string becomes {version = ...}
    effective: dict[str, Any] = load_json(json.dumps(additions, default=str))

    def place(path: tuple[str, ...], adding: dict[str, Any], having: Mapping[str, Any], headed: bool) -> None:
        for key, value in list(adding.items()):
            here = (*path, str(key))
            if key in having:
                if isinstance(value, dict) and isinstance(having[key], Mapping):
                    place(here, value, having[key], _has_header(text, here))
                elif having[key] != value:
                    raise ReferenceError(
                        f"Cargo.toml's {'.'.join(here)} is {having[key]!r} in the crate and {value!r} in the reference"
                    )
            elif isinstance(value, Mapping):
                tables.append(_table_text(here, value))
            elif headed and path:
                under.setdefault(path, []).append(_line(str(key), value))
            elif path and path[-1] in DEPENDENCY_TABLES and isinstance(value, str):
                adding[key] = {"version": value}
                tables.append(_table_text(here, adding[key]))
            else:
                raise ReferenceError(f"Cargo.toml: the reference adds {'.'.join(here)}, which no edit can place here")

    place((), effective, doc, False)
    edits = [(f"{_header(path)}\n", f"{_header(path)}\n{''.join(lines)}") for path, lines in under.items()]
    if tables:
        edits.append(("[package]\n", "\n".join(tables) + "\n[package]\n"))
    _check(text, edits, merged(doc, effective))
    return edits


def _has_header(text: str, path: tuple[str, ...]) -> bool:
    return re.search(rf"^{re.escape(_header(path))}[ \t]*$", text, re.M) is not None


def _check(text: str, edits: list[tuple[str, str]], expected: dict[str, Any]) -> None:
    for search, replace in edits:
        if text.count(search) != 1:
            raise ReferenceError(f"Cargo.toml: {search.strip()!r} is not in the crate's manifest exactly once")
        text = text.replace(search, replace)
    try:
        result = load_toml(text)
    except ValueError as exc:
        raise ReferenceError(f"Cargo.toml with the reference's additions is not valid TOML: {exc}") from None
    if result != expected:
        raise ReferenceError("Cargo.toml: the reference's additions cannot be written as edits of the crate's manifest")


def starting_manifest(task: Task, registry: Registry) -> str:
    """The ``Cargo.toml`` the task's attempt starts from: the staged exercise's, or the registry crate's."""
    if task.source is not None:
        root, name = task.source, "Cargo.toml"
    elif task.crate:
        source_dir = getattr(registry, "source_dir", None)
        if source_dir is None:
            raise ReferenceError(f"the registry {registry.id} cannot show {task.crate}'s Cargo.toml")
        root, name = Path(source_dir(registry.get(task.crate))), "Cargo.toml"
    else:
        raise ReferenceError("a reference solution needs the task's crate (task.toml's crate = ...)")
    data, more = read_inside(root, name, MAX_FILE_BYTES)
    if more:
        raise ReferenceError(f"{root / name} is too large to be a manifest")
    return data.decode("utf-8")


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def reference_script(task: Task, manifest: str) -> list[dict[str, Any]]:
    """The replies that apply ``task``'s reference to a crate whose ``Cargo.toml`` is ``manifest``, then finish."""
    reference = task.reference
    if reference is None:
        raise ReferenceError(f"the task {task.id!r} has no reference solution")
    calls = []
    for inside, source in reference.files:
        try:
            data, more = read_inside(reference.root, source, MAX_FILE_BYTES)
            content = data.decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ReferenceError(f"{source} cannot be read as UTF-8 text: {exc}") from None
        if more:
            raise ReferenceError(f"{source} is larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB")
        calls.append(_call("write_file", path=inside, content=content))
    if reference.manifest:
        for search, replace in manifest_edits(manifest, reference.manifest):
            calls.append(_call("replace_in_file", path="Cargo.toml", search=search, replace=replace))
    calls.append(_call("run_checks"))
    written = ", ".join(inside for inside, _ in reference.files)
    first = {
        "role": "assistant",
        "content": f"The reference solution of {task.id}, applied as files ({written}), not a model's answer.",
        "tool_calls": [{**call, "id": f"call_{i}"} for i, call in enumerate(calls)],
    }
    last = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{**_call("finish", summary=f"{task.id}: the reference solution"), "id": "call_0"}],
    }
    return [first, last]
