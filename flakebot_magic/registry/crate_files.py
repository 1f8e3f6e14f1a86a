"""What an unpacked crate's own files say: its manifest, its binary targets, what they read, what they say they do.

Read when a directory registry builds its search index (:mod:`.directory`),
outside any sandbox: every file a crate names (its ``readme``, a
``[[bin]] path``) or holds is read through one function,
:func:`flakebot_magic.host.fsutil.read_inside` (inside the crate's directory
only, regular files only, no symlink at any step, never blocking, capped).

* :func:`tool_binaries`: the binary targets cargo would build that are tools
  (test, example and benchmark helpers left out, :func:`fixture_binary`);
* :func:`binary_input`: what those binaries read, as their sources show it:
  standard input, files named on the command line, arguments only, or
  nothing (a demo that prints a fixed result, or a binary that only works
  with a feature flakebot does not enable);
* :func:`binary_text`: what they say they do: their ``//!`` doc comments,
  clap's ``about``, their usage line, and the README's usage section or
  pasted ``--help`` output.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..host.fsutil import is_real_dir, load_toml, read_inside
from ..host.trees import Walk

__all__ = [
    "BINARY_TEXT_LIMIT",
    "INPUTS",
    "README_LIMIT",
    "binary_input",
    "binary_text",
    "fixture_binary",
    "read_capped",
    "read_manifest",
    "readme",
    "readme_summary",
    "tool_binaries",
    "well_typed",
]

README_LIMIT = 16_000
#: how much of what a crate's binaries say is indexed
BINARY_TEXT_LIMIT = 2_000
#: what a binary's input can be (:func:`binary_input`), the ones a string can be handed to first
INPUTS = ("stdin", "args", "file", "none")


#: the largest manifest read
_MANIFEST_LIMIT = 1024 * 1024


def read_manifest(path: Path) -> dict[str, Any]:
    """Parse the ``Cargo.toml`` at ``path`` (a regular file, capped) into plain Python values.

    Raises ``ValueError`` if it is not TOML (or too large), ``OSError`` if it cannot be read as a regular file.
    """
    data, more = read_inside(path.parent, path.name, _MANIFEST_LIMIT)
    if more:
        raise ValueError(f"{path} passes {_MANIFEST_LIMIT // 1024} KiB")
    return well_typed(load_toml(data.decode("utf-8", errors="replace")))


#: the manifest's tables (a mapping each) and arrays of tables, as cargo types them
_TABLES = (
    "package",
    "lib",
    "features",
    "dependencies",
    "dev-dependencies",
    "build-dependencies",
    "target",
    "workspace",
)
_ARRAYS = ("bin", "example", "test", "bench")


def well_typed(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` without what has the wrong type for cargo (``package = 0``, ``bin = "x"``): cargo would refuse such
    a manifest, and what reads it here can then count on the types (no AttributeError from a crate's data).

    >>> well_typed({"package": 0, "bin": [{"name": "a"}, 5], "lib": {"path": "x"}})
    {'bin': [{'name': 'a'}], 'lib': {'path': 'x'}}
    """
    kept: dict[str, Any] = {}
    for key, value in doc.items():
        if key in _TABLES and not isinstance(value, dict):
            continue
        if key in _ARRAYS:
            if not isinstance(value, list):
                continue
            value = [item for item in value if isinstance(item, dict)]
        kept[key] = value
    package = kept.get("package")
    if isinstance(package, dict):
        for key in ("keywords", "categories"):
            if key in package and not isinstance(package[key], list):
                package = {k: v for k, v in package.items() if k != key}
        kept["package"] = package
    return kept


#: words in a binary's name or path that mark a test, example or benchmark helper, never a tool
_FIXTURE_WORDS = frozenset(
    {"fixture", "fixtures", "test", "tests", "testing", "example", "examples", "bench", "benches"}
)
#: directories whose binaries are helpers of the crate's own tests
_FIXTURE_DIRS = ("tests/", "examples/", "benches/", "fixtures/", "test/")
#: features that only development needs: a binary requiring one is a helper (``criterion``: benchmarks)
_DEV_FEATURES = re.compile(r"test|bench|fixture|criterion|example|dev\b|internal|unstable", re.I)


def fixture_binary(name: str, path: str = "", required_features: tuple[str, ...] = ()) -> str:
    """Why a binary target is a test, example or benchmark helper rather than a tool ("" when it is a tool).

    Told apart by its name's words (``stdio-fixture``, ``gen_hash_test``,
    ``*-do-not-use``), its path (under ``tests/``, ``examples/``,
    ``benches/``) or features it requires that only development needs.

    Examples
    --------
    >>> fixture_binary("stdio-fixture")
    "its name says it is a test fixture ('stdio-fixture')"
    >>> fixture_binary("hexyl", "src/main.rs")
    ''
    """
    words = set(re.split(r"[-_.\s]+", name.lower()))
    if words & _FIXTURE_WORDS or "do-not-use" in name.lower():
        return f"its name says it is a test fixture ({name!r})"
    clean = path.replace("\\", "/").lstrip("./")
    if clean.startswith(_FIXTURE_DIRS) or any(f"/{d}" in clean for d in _FIXTURE_DIRS):
        return f"it lives under {clean.split('/')[0]}/ ({clean})"
    if any(_DEV_FEATURES.search(f) for f in required_features):
        return f"it needs the development-only feature(s) {', '.join(required_features)}"
    return ""


def _default_bin_path(crate_dir: Path, name: str) -> str:
    """Where cargo looks for a ``[[bin]]`` that gives no ``path``."""
    for path in (f"src/bin/{name}.rs", f"src/bin/{name}/main.rs"):
        if (crate_dir / path).is_file():
            return path
    return "src/main.rs"


def _bin_targets(crate_dir: Path, manifest: dict[str, Any]) -> list[tuple[str, str, tuple[str, ...]]]:
    """The binary targets cargo would build: name, path and required features of each."""
    package = manifest.get("package", {})
    targets: dict[str, tuple[str, str, tuple[str, ...]]] = {}
    for b in manifest.get("bin", []):
        if isinstance(b, dict) and isinstance(b.get("name"), str):
            features = b.get("required-features") or b.get("required_features") or []
            given = b.get("path")
            path = given if isinstance(given, str) else _default_bin_path(crate_dir, b["name"])
            targets.setdefault(b["name"], (b["name"], path, tuple(str(f) for f in features if isinstance(f, str))))
    if package.get("autobins", True) is not False:
        if (crate_dir / "src" / "main.rs").is_file():
            name = package.get("name", crate_dir.name)
            targets.setdefault(name, (name, "src/main.rs", ()))
        bin_dir = crate_dir / "src" / "bin"
        if bin_dir.is_dir():
            for entry in sorted(bin_dir.iterdir()):
                if entry.suffix == ".rs":
                    targets.setdefault(entry.stem, (entry.stem, f"src/bin/{entry.name}", ()))
                elif (entry / "main.rs").is_file():
                    targets.setdefault(entry.name, (entry.name, f"src/bin/{entry.name}/main.rs", ()))
    return list(targets.values())


#: how much of a crate's sources one scan reads
_SCAN_LIMIT = 512 * 1024


def read_capped(crate_dir: Path, path: Path | str, limit: int) -> bytes:
    """The first ``limit`` bytes of the crate's regular file ``path`` (inside ``crate_dir``); ``b""`` when there is none.

    ``path`` is relative to ``crate_dir``, or under it; anything else (``/proc/self/environ``, ``../x``,
    a symlink, a FIFO) reads as nothing (:func:`~flakebot_magic.host.fsutil.read_inside`).
    """
    relative = str(path)
    if Path(relative).is_absolute() and Path(relative).is_relative_to(crate_dir):
        relative = Path(relative).relative_to(crate_dir).as_posix()
    try:
        return read_inside(crate_dir, relative, limit)[0]
    except OSError:
        return b""


def _rust_files(directory: Path) -> list[Path]:
    """The ``.rs`` files under ``directory``, sorted: an explicit stack, no symlinked directory entered."""
    if not is_real_dir(directory):
        return []
    return sorted(Path(d) / f for d, _, files in Walk(directory) for f in files if f.endswith(".rs"))


def _test_sources(crate_dir: Path) -> bytes:
    """The crate's own test code (``tests/``, ``src/**/test.rs`` and ``tests.rs``), capped."""
    paths = _rust_files(crate_dir / "tests")
    paths += [p for p in _rust_files(crate_dir / "src") if p.name in ("test.rs", "tests.rs")]
    text, budget = [], _SCAN_LIMIT
    for path in paths:
        if budget <= 0:
            break
        text.append(read_capped(crate_dir, path, budget))
        budget -= len(text[-1])
    return b"\n".join(text)


#: a binary this small that the crate's tests run by name is a test helper, not a tool
_HELPER_BYTES = 4096


def _helper(crate_dir: Path, source: str, name: str, tests: bytes) -> bool:
    code = read_capped(crate_dir, source, _HELPER_BYTES)
    return bool(code) and len(code) < _HELPER_BYTES and f'"{name}"'.encode() in tests


def _tool_targets(crate_dir: Path, manifest: dict[str, Any]) -> list[tuple[str, str, tuple[str, ...]]]:
    package = manifest.get("package", {})
    targets = [t for t in _bin_targets(crate_dir, manifest) if not fixture_binary(*t)]
    crate = str(package.get("name", crate_dir.name))
    lib = (crate_dir / "src" / "lib.rs").is_file() or isinstance(manifest.get("lib"), dict)
    if lib and any(name != crate for name, _, _ in targets):
        tests = _test_sources(crate_dir)
        targets = [t for t in targets if t[0] == crate or not _helper(crate_dir, t[1], t[0], tests)]
    return targets


def tool_binaries(crate_dir: Path, manifest: dict[str, Any]) -> list[str]:
    """The binary targets cargo would build for this manifest that are tools (test fixtures left out).

    Besides :func:`fixture_binary`'s signs, a library's binary that is not
    named after the crate, whose source is small and that the crate's own
    tests run by name (duct's ``cat``, ``x_to_y``) is a test helper.
    """
    return [name for name, _, _ in _tool_targets(crate_dir, manifest)]


def _tool_sources(crate_dir: Path, manifest: dict[str, Any]) -> list[bytes]:
    """The sources of the tool binaries (``src/main.rs``, ``src/bin/``, ``[[bin]]`` paths and their modules), capped."""
    fixtures = {crate_dir / p for n, p, f in _bin_targets(crate_dir, manifest) if fixture_binary(n, p, f)}
    paths = [crate_dir / p for _, p, _ in _tool_targets(crate_dir, manifest)]
    if any(p.is_relative_to(crate_dir / "src" / "bin") for p in paths):  # their modules sit beside them
        paths += [p for p in _rust_files(crate_dir / "src" / "bin") if p not in fixtures and p not in paths]
    sources, budget = [], _SCAN_LIMIT
    for path in paths:
        if budget <= 0:
            break
        sources.append(read_capped(crate_dir, path, budget))
        budget -= len(sources[-1])
    return sources


_STDIN = re.compile(rb"\bstdin\b")
_FILES = re.compile(rb"\bFile::open\b|\bfs::read(?:_to_string)?\b|\bOpenOptions\b|\bPath(?:Buf)?::(?:new|from)\b")
_ARGS = re.compile(rb"\benv::args(?:_os)?\b|\bclap\b|\bstructopt\b|\bgetopts\b|\bargh\b|\bpico_args\b|\blexopt\b")
#: a ``main`` that exists only without a feature: the real one needs that feature
_FEATURE_GATED_MAIN = re.compile(rb'#\[cfg\(not\(feature\s*=\s*"([^"]+)"\)\)\]\s*(?:pub\s+)?fn\s+main\b')


def binary_input(crate_dir: Path, manifest: dict[str, Any]) -> str:
    """What the crate's tool binaries read, as a static look at their sources shows (one of :data:`INPUTS`).

    ``stdin``: a source mentions standard input (a string can be piped in);
    ``file``: they open paths and never standard input (a string is no file:
    the markdown crate's debug binary); ``args``: they read only their
    command line (``qrencode TEXT``); ``none``: they read nothing (a demo
    printing a fixed table), or their ``main`` without a feature that is not
    a default one only says the binary needs it. ``""``: no tool binary.
    """
    sources = _tool_sources(crate_dir, manifest)
    if not sources:
        return ""
    text = b"\n".join(sources)
    defaults = set((manifest.get("features") or {}).get("default") or [])
    if any(m.decode() not in defaults for m in _FEATURE_GATED_MAIN.findall(text)):
        return "none"
    if _STDIN.search(text):
        return "stdin"
    if _FILES.search(text):
        return "file"
    if _ARGS.search(text):
        return "args"
    return "none"


def readme(crate_dir: Path, package: dict[str, Any]) -> str:
    """The crate's README (the manifest's ``readme`` inside the crate, else a usual name), capped at :data:`README_LIMIT`."""
    given = package.get("readme")
    names = [given] if isinstance(given, str) else []
    names += ["README.md", "README", "readme.md", "README.rst", "README.txt"]
    for name in names:
        text = read_capped(crate_dir, name, README_LIMIT * 4)
        if text:
            return text.decode("utf-8", "replace")[:README_LIMIT]
    return ""


#: README lines that are no prose: badges, links, headings, HTML, fences, tables, rules
_NOT_PROSE = ("[!", "![", "[", "<", "#", "```", "|", "---", "===")
_MARKDOWN_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")


def readme_summary(text: str, limit: int) -> str:
    """What a README says first, in prose: code blocks, badges, headings, HTML and tables left out,
    ``[text](link)`` read as its text, on one line, cut at a word at most ``limit`` characters long.

    Examples
    --------
    >>> readme_summary("# walkdir\\n[![ci](x)](y)\\n\\nA [crate](https://x) to walk a directory recursively.", 30)
    'A crate to walk a directory'
    """
    prose = _FENCE.sub("", text)
    lines = [line for line in prose.splitlines() if line.strip() and not line.lstrip().startswith(_NOT_PROSE)]
    joined = " ".join(_MARKDOWN_LINK.sub(r"\1", " ".join(lines)).split())
    if len(joined) <= limit:
        return joined
    cut = joined[: limit + 1]
    return cut[: cut.rindex(" ")] if " " in cut else cut[:limit]


_DOC_COMMENT = re.compile(r"^[ \t]*//![ \t]?(.*)$", re.M)
_STRING = r'r(#*)"(.*?)"\1|"((?:[^"\\]|\\.)*)"'
_LITERAL = re.compile(_STRING, re.S)
#: clap's and structopt's ``about`` and ``long_about``, as a method or an attribute
_ABOUT = re.compile(r"\b(?:long_)?about\s*(?:\(\s*|=\s*)(?:" + _STRING + ")", re.S)
_USAGE = re.compile(r"\busage\b", re.I)
_PROSE_WORD = re.compile(r"[A-Za-z]{2,}")
#: how far after a usage line a literal may start and still be its text
_NEAR_USAGE = 200
_ESCAPE = re.compile(r"\\\n\s*|\\[nrt]|\\(.)")
#: a README heading over a section about running the binary
_USAGE_HEADING = re.compile(r"^(#{1,6})[ \t]+[^\n]*\b(usage|command[- ]line|cli|how to use|running)\b", re.I | re.M)
#: the options part of a pasted ``--help`` output
_OPTIONS_HEADER = re.compile(r"^\s*(usage|flags|options|arguments|args|commands|subcommands)\s*:", re.I | re.M)
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
#: how much of one README passage is taken
_PASSAGE = 400


def _first_paragraph(lines: list[str]) -> list[str]:
    """The lines up to the first empty one: what a doc comment says first is what the binary is."""
    first: list[str] = []
    for line in lines:
        if not line.strip():
            if first:
                break
            continue
        first.append(line)
    return first


def _unescape(literal: str) -> str:
    return " ".join(_ESCAPE.sub(lambda m: m.group(1) or " ", literal).split())


def _readme_usage(text: str) -> list[str]:
    """What the README says about running the tool: the prose of pasted ``--help`` outputs (before their
    options), and the first paragraph of sections headed "Usage", "Command line" and the like."""
    found = []
    for block in _FENCE.findall(text):
        header = _OPTIONS_HEADER.search(block)
        if header:
            found.append(block[: header.start()][:_PASSAGE])
    prose = _FENCE.sub("", text)
    for heading in _USAGE_HEADING.finditer(prose):
        paragraph = prose[heading.end() :].strip().split("\n\n", 1)[0]
        if not paragraph.lstrip().startswith("#"):
            found.append(paragraph[:_PASSAGE])
    return found


def binary_text(crate_dir: Path, manifest: dict[str, Any]) -> str:
    """What the crate's tool binaries say they do, for the index (empty for a crate without one).

    Their names; the first paragraph of their ``//!`` doc comments; the
    ``about`` and ``long_about`` they give clap or structopt; the string literals that
    carry a usage line ("Usage: {} [options] ... Reads markdown from standard
    input and emits HTML."); and the README's sections on running the tool
    and the prose of ``--help`` output pasted into it. Not every help string:
    a big tool's option list mentions every word and says nothing of what it
    is for. Capped at :data:`BINARY_TEXT_LIMIT` characters.
    """
    targets = _tool_targets(crate_dir, manifest)
    if not targets:
        return ""
    parts = [" ".join(name for name, _, _ in targets)]
    for source in _tool_sources(crate_dir, manifest):
        code = source.decode("utf-8", "replace")
        parts.append(" ".join(_first_paragraph(_DOC_COMMENT.findall(code))))
        parts += [_unescape(raw_body or plain) for _, raw_body, plain in _ABOUT.findall(code)]
        usage_end = -1
        for literal in _LITERAL.finditer(code):
            text = _unescape(literal.group(2) or literal.group(3) or "")
            if _USAGE.search(text):
                parts.append(text)
                usage_end = literal.end()
            elif 0 <= literal.start() - usage_end <= _NEAR_USAGE and len(_PROSE_WORD.findall(text)) >= 3:
                parts.append(text)  # the text a usage format string is given ("Usage: {}\n\n{}", program, TEXT)
    parts += _readme_usage(readme(crate_dir, manifest.get("package", {})))
    kept: list[str] = []
    total = 0
    for part in parts:
        part = " ".join(part.split())[:_PASSAGE]
        if part and total < BINARY_TEXT_LIMIT:
            kept.append(part[: BINARY_TEXT_LIMIT - total])
            total += len(kept[-1]) + 1
    return "\n".join(kept)
