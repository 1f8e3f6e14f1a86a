"""A name from untrusted data passes one validator (a path) or one escaper (source code) first (issue 33, A).

Red team 33: a polyglot exercise's ``[package] name`` (a checkout, S7) was joined onto
``OUT/polyglot/crates/E/src/bin/<name>.rs`` unchecked (``../../..`` wrote any ``*.rs`` the user can write) and
pasted into the placeholder's ``println!`` unescaped (the rest of the name ran as Rust the next time the user
built their project). The class, and what now holds for it:

* a name that becomes a path component is a crate name (``check_crate_field``), a tool name
  (``check_tool_name``) or a binary name (``BINARY_NAME``): the polyglot exercise's crate, ``export``'s tool and
  program, the fork's module files (read with ``read_inside``, no path from the manifest followed);
* a name pasted into generated source goes through its language's escaper (``host/literals.py``: Rust, Nix;
  tomlkit and ``json.dumps`` for TOML): property-tested here, and with ``rustc`` itself on the hardest strings;
* every raw file write of the package is an atomic, link-refusing one or listed with why (the audit below).
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from package_calls import package_calls

from flakebot_magic.host.fsutil import load_toml

TRICKY = [
    'x"); std::process::exit(3); ("',
    "{}{{}}{0}",
    'a\\b\\"c',
    "line\nbreak\r\ttab",
    "é ünï 🦀",
    "\x00\x7f\x1b[2J",
]


def _read_rust_literal(literal: str) -> str:
    """What a Rust format-string literal made of rust_string's escapes prints (a reader written apart from it)."""
    assert literal.startswith('"') and literal.endswith('"')
    body, out, i = literal[1:-1], [], 0
    while i < len(body):
        ch = body[i]
        if ch == "\\":
            if body[i + 1] == "u":
                end = body.index("}", i)
                out.append(chr(int(body[i + 3 : end], 16)))
                i = end + 1
                continue
            out.append(body[i + 1])
            i += 2
            continue
        assert ch != '"', f"an unescaped quote ends the literal early: {literal!r}"
        if ch in "{}":
            assert body[i + 1] == ch, f"a lone brace is a format argument: {literal!r}"
            i += 1
        assert " " <= ch <= "~", f"a raw non-ASCII or control character: {literal!r}"
        out.append(ch)
        i += 1
    return "".join(out)


@settings(max_examples=300, deadline=None)
@given(st.text())
@example(TRICKY[0])
def test_a_rust_literal_reads_back_as_the_text_it_was_made_from(text: str) -> None:
    from flakebot_magic.host.literals import rust_string

    assert _read_rust_literal(rust_string(text)) == text


@settings(max_examples=300, deadline=None)
@given(st.text().filter(lambda t: "\0" not in t))
def test_a_nix_literal_has_no_unescaped_quote_or_interpolation(text: str) -> None:
    from flakebot_magic.host.literals import nix_string

    body = nix_string(text)[1:-1]
    unescaped = re.sub(r"\\.", "", body, flags=re.S)
    assert '"' not in unescaped and "${" not in unescaped


@pytest.mark.cargo
def test_rustc_prints_what_the_literals_say(tmp_path: Path) -> None:
    """The Rust escaper checked by rustc itself: each tricky text, printed by a program made with it."""
    from flakebot_magic.host.literals import rust_string

    rustc = shutil.which("rustc")
    if rustc is None:
        pytest.skip("no rustc on PATH")
    lines = "".join(f"    println!({rust_string(text)});\n" for text in TRICKY)
    (tmp_path / "main.rs").write_text(f"fn main() {{\n{lines}}}\n", encoding="utf-8")
    subprocess.run([rustc, "-o", str(tmp_path / "main"), str(tmp_path / "main.rs")], check=True, timeout=300)
    printed = subprocess.run([str(tmp_path / "main")], capture_output=True, check=True, timeout=30).stdout
    assert printed.decode() == "".join(text + "\n" for text in TRICKY)


def _exercise(root: Path, name: str) -> Path:
    exercise = root / "rust" / "exercises" / "practice" / "ex"
    for folder in (".docs", "src", "tests"):
        (exercise / folder).mkdir(parents=True)
    (exercise / ".docs" / "instructions.md").write_text("Do it.\n")
    (exercise / "src" / "lib.rs").write_text("pub fn f() {}\n")
    (exercise / "tests" / "ex.rs").write_text("#[test]\nfn t() {}\n")
    (exercise / "Cargo.toml").write_text(f"[package]\nname = {json.dumps(name)}\nversion = '1.0.0'\n")
    return root / "rust"


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.text(max_size=80), st.sampled_from(["../../../../x", "a/b", "..", "-x", "ok_name", "x" * 65])))
@example("../../../../../../outside/planted")
@example('../x"); std::process::Command::new("touch").arg("pwned").status().ok(); ("')
def test_a_checkouts_package_name_is_a_crate_name_or_a_problem(name: str) -> None:
    """The polyglot door, over any name: staged only under the staging directory, the placeholder's name a crate
    name (no path, no code), or a problem that says so."""
    from flakebot_magic.eval.polyglot import polyglot_suite
    from flakebot_magic.registry.base import check_crate_field

    root = Path(tempfile.mkdtemp(prefix="names-"))
    try:
        staging = root / "out" / "polyglot"
        suite = polyglot_suite(_exercise(root, name), staging)
        for task in suite.tasks:
            assert check_crate_field("name", task.crate) == name
            staged = load_toml(task.source / "Cargo.toml")  # type: ignore[operator]
            assert staged["package"]["metadata"]["flakebot"]["bin"] == name
        written = [p for p in root.rglob("*") if not p.is_relative_to(root / "rust") and p != root / "out"]
        assert all(p.is_relative_to(staging) for p in written), written
        if not suite.tasks:
            assert "crate name" in suite.problems[0].message or "Cargo.toml cannot be read" in suite.problems[0].message
    finally:
        shutil.rmtree(root, ignore_errors=True)


#: every raw file write of the package (not atomic_write, not edit/files.write_text) -> why it is safe
RAW_WRITES = {
    ("backends/nix_cache.py", "write_text"): "the proof's file in a fresh TemporaryDirectory of flakebot's own",
    ("clients/cli_tool.py", "write_text"): "input.txt in a scratch directory made for this one call",
    ("eval/hidden.py", "write_text"): "pytest.ini in the hidden run's own directory (no crate file is there)",
    ("eval/pytest_plugin.py", "write_text"): "the report, at the path flakebot's eval gave the child pytest",
    ("host/site_defaults.py", "write_text"): "a temporary file beside the person's own settings, then os.replace",
    ("manage/export.py", "write_text"): "replit.nix and .replit in the directory the person gave export",
    ("sandbox/limits.py", "write_text"): "a cgroup's limit files, in the cgroup flakebot made",
    ("edit/forks.py", "os.open O_CREAT"): "O_EXCL | O_NOFOLLOW",
    ("records/journal.py", "os.open O_CREAT"): "O_EXCL | O_NOFOLLOW, in the private cache",
    ("host/fsutil.py", "os.open O_CREAT"): "atomic_write and copy_regular themselves: O_EXCL | O_NOFOLLOW",
    ("host/locks.py", "os.open O_CREAT"): "O_NOFOLLOW, a lock in the private cache",
    ("records/inventory.py", "os.open O_CREAT"): "the inventory's database file in the private cache",
    ("registry/shared_index.py", "os.open O_CREAT"): "O_NOFOLLOW, the shared index's lock",
    ("sandbox/cargo.py", "os.open O_CREAT"): "O_EXCL | O_NOFOLLOW, the lock file bound writable",
    ("stages/deploy.py", "os.open O_CREAT"): "O_EXCL | O_NOFOLLOW, a binary into a fresh store entry",
    ("stages/deps.py", "os.open O_CREAT"): "O_NOFOLLOW, a dependency set's lock in the private cache",
    ("stages/deps.py", "open for writing"): "a stub build's log, appended beside its directory in the private cache",
    ("sandbox/unit_wrapper.py", "open for writing"): "inside the sandbox, in a unit's private out-dir the wrapper made",
}


def test_every_raw_file_write_is_listed_with_why_it_is_safe() -> None:
    found = set()
    for module, node in package_calls():
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ("write_text", "write_bytes"):
            found.add((module, func.attr))
        elif isinstance(func, ast.Attribute) and func.attr == "open" and "O_CREAT" in ast.dump(node):
            found.add((module, "os.open O_CREAT"))
        elif (
            isinstance(func, ast.Name)
            and func.id == "open"
            and any(isinstance(a, ast.Constant) and set(str(a.value)) & set("wax") for a in node.args[1:2])
        ):
            found.add((module, "open for writing"))
    unlisted = sorted(found - set(RAW_WRITES))
    assert unlisted == [], (
        "a file write that may follow a planted link or land outside its root: use host/fsutil.atomic_write "
        f"(root=...) and real_dir, or list it with why it is safe: {unlisted}"
    )
    assert sorted(set(RAW_WRITES) - found) == [], "listed writes that are gone (remove them)"
