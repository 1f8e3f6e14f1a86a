"""The names sandboxed code gives files are data: no name ends a session with a traceback or carries an escape.

A crate's test chooses the names of what it leaves in the workspace: bytes
that are not UTF-8, escape sequences, a newline, a bidirectional override.
flakebot turns names into text at a few doors: what it tells the model (the
policy's verdict, ``list_files``), the check run's commit message, notices and
errors. Before (red team 5), a test that planted a file named ``b"src/\\xff"``
ended the edit session with ``UnicodeEncodeError`` at the next model request
(a name that is not UTF-8 is a string with a surrogate, which no JSON body
carries), and the policy's verdict wrote the name's escape sequences raw into
the commit message.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from editscripts import call, reply, tinyhex_done
from hypothesis import given
from hypothesis import strategies as st
from test_policy_session import _hostile_test, hex_registry, session  # noqa: F401
from tinycrates import write_registry
from tinyhex_sessions import Session

import flakebot_magic
from flakebot_magic.host.git import Git
from flakebot_magic.host.process import ProcessRunner
from flakebot_magic.llm.channel import encodable
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.sandbox.policy import Violation
from flakebot_magic.stages.deploy import source_digest
from flakebot_magic.stages.source import import_source
from flakebot_magic.untrusted import is_safe

#: a name not UTF-8 with an OSC 52 and a newline (a regular file: committed, listed)
_PLANT_FILE = (
    "        use std::os::unix::ffi::OsStrExt;\n"
    '        let odd = std::ffi::OsStr::from_bytes(b"src/\\xff\\xfe\\x1b]52;c;SGk=\\x07\\nforged.rs");\n'
    '        std::fs::write(std::path::Path::new(dir).join(odd), "data").unwrap();'
)
#: a clear screen, a carriage return and an override, on a symlink out of the crate (refused by the policy)
_PLANT_LINK = (
    '        std::os::unix::fs::symlink("/etc/\\x1b[2J", format!("{}/src/\\x1b[2J\\rok\\u{202e}.rs", dir)).unwrap();'
)

#: a library the compiler refuses with a message of the code's choosing
_BROKEN = _hostile_test("") + 'compile_error!("\\x1b]52;c;SGk=\\x07 \\x1b[2J broken");\n'


@pytest.mark.cargo
def test_hostile_file_names_reach_the_model_and_the_history_as_safe_text(
    session: Callable[..., Session],  # noqa: F811
) -> None:
    s = session(
        [
            reply(call("write_file", path="src/lib.rs", content=_hostile_test(_PLANT_FILE)), call("run_checks")),
            reply(call("list_files", path="src")),
            reply(call("write_file", path="src/lib.rs", content=_hostile_test(_PLANT_LINK)), call("run_checks")),
            # the compiler quotes a message the code chose (the commit message lists the errors)
            reply(call("write_file", path="src/lib.rs", content=_BROKEN), call("run_checks")),
            reply(call("write_file", path="src/lib.rs", content=_hostile_test("")), call("run_checks")),
            *tinyhex_done(),
        ]
    )
    outcome = s.loop.run("print standard input as hex")  # before: UnicodeEncodeError at the third request

    assert outcome.contract.bin == "tinyhex"
    [listing] = [r for r in s.tool_replies(3) if r.startswith("src/")]
    assert "src/\ufffd\ufffd" in listing  # every request was UTF-8 JSON: the name not UTF-8 shown as U+FFFD
    [refused] = [run for run in outcome.runs if run.policy]
    assert refused.policy and all(is_safe(v) and "\n" not in v for v in refused.policy), refused.policy
    [verdict] = [r for r in s.tool_replies(4) if r.startswith("Check run 2")]
    assert is_safe(verdict) and "REVERTED: the build policy refuses src/ ok\ufffd.rs (a symlink" in verdict
    # the history: no escape sequence or control character in any commit message, the compiler's quoted too
    log = subprocess.run(["git", "log", "--format=%B%x00"], cwd=s.root, capture_output=True, check=True).stdout
    messages = log.decode("utf-8").split("\0")
    assert all(is_safe(m) for m in messages), [m for m in messages if not is_safe(m)]
    assert any(" broken" in m and "- error src/lib.rs" in m for m in messages)  # the error is there, made safe


def test_every_commit_message_passes_gits_one_rule() -> None:
    """Only ``host/git.py`` starts ``git commit`` or ``git commit-tree`` (each through ``safe_text``)."""
    package = Path(flakebot_magic.__file__).parent
    starts = re.compile(r"""["']commit["']\s*,\s*["']-|["']commit-tree["']""")
    found = [
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if starts.search(path.read_text()) and path != package / "host" / "git.py"
    ]
    assert found == []


#: any text, with what a name from the disk holds more often than chance: surrogates (bytes not UTF-8),
#: escape introducers, newlines, overrides
_TEXT = st.text(st.characters() | st.sampled_from(["\udcff", "\ud800", "\x1b", "\x9b", "\x07", "\n", "\r", "\u202e"]))


@given(_TEXT, _TEXT, _TEXT)
def test_a_violation_is_safe_text_whatever_the_name(path: str, reason: str, remedy: str) -> None:
    shown = str(Violation(path, reason, remedy))
    assert is_safe(shown)
    assert "\n" not in Violation(path, reason).path


def _nested(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4)


_JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | _TEXT, _nested, max_leaves=20)


@given(_JSONISH)
def test_every_request_body_encodes_as_utf8_and_encodable_text_is_kept(value: Any) -> None:
    made = encodable(value)
    json.dumps(made, ensure_ascii=False).encode("utf-8")  # what the SDK sends: never UnicodeEncodeError
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return
    assert made == json.loads(json.dumps(value))  # nothing changes in what could be sent already


# -- names and link targets that are not UTF-8: bytes, at every door that hashes, copies or commits them -----


def test_a_registry_with_names_not_utf8_opens_forks_and_commits_without_a_traceback(tmp_path: Path) -> None:
    """Before: the directory registry's signature, its tree checksum and the first commit each ended with
    ``UnicodeEncodeError`` (``str.encode`` of a name read with ``os.fsdecode``)."""
    registry = write_registry(tmp_path / "registry", ["tinyecho"])
    os.mkdir(os.fsencode(registry) + b"/\xff-0.1.0")  # an entry of the registry itself
    crate_dir = os.fsencode(next(p for p in registry.iterdir() if p.name.startswith("tinyecho")))
    Path(os.fsdecode(crate_dir + b"/src/\xff.rs")).write_text("data")
    os.symlink(b"src/\xfe", crate_dir + b"/link")
    opened = DirectoryRegistry(registry, tmp_path / "cache")
    try:
        [found] = [c for c in opened.search("echo") if c.name == "tinyecho"]
        fetched = opened.fetch(found, tmp_path / "staging")
    finally:
        opened.close()
    dest = tmp_path / "workspace"
    dest.mkdir()
    git = Git(dest, ProcessRunner())
    git.init("published")
    imported = import_source(fetched.path, dest)
    git.commit_files("Published source", imported.files)
    assert imported.dropped == {
        "src/\\xff.rs": "a name that is not UTF-8",
        "link": "a symlink whose target is not UTF-8",
    }
    assert "src/main.rs" in imported.files and all(name.isprintable() for name in imported.files)
    assert is_safe(imported.describe())


def test_the_store_key_hashes_a_link_target_that_is_not_utf8_as_its_bytes(tmp_path: Path) -> None:
    """A test leaves an ignored link whose target is not UTF-8: the next build's key is computed (before: a
    traceback), and differs from another target's."""
    git = Git(tmp_path, ProcessRunner())
    git.init("main")
    (tmp_path / ".gitignore").write_text("left*\n")
    git.commit("first", all_files=True)
    keys = []
    for target in (b"\xff", b"\xfe"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_path / "left")
        os.symlink(target, os.fsencode(tmp_path / "left"))
        keys.append(source_digest(git).hexdigest())
    assert keys[0] != keys[1]


def test_no_module_encodes_a_name_from_disk_as_strict_utf8() -> None:
    """``os.readlink(...).encode()`` (and ``.encode()`` of a listing) fails on bytes that are not UTF-8:
    names and targets become bytes through ``os.fsencode`` or are read as bytes."""
    package = Path(flakebot_magic.__file__).parent
    strict = re.compile(r"readlink\([^()]*(\([^()]*\))?[^()]*\)\.encode\(\)|listdir\([^)]*\)\)\.encode\(\)")
    assert [str(p.relative_to(package)) for p in package.rglob("*.py") if strict.search(p.read_text())] == []
