"""Issues 10 and 20 end to end, without a model: what the registry holds builds on today's compiler (rustdoc
too), a tool's result is data, and a failure the published crate's own doc tests cause is told as its own.

Real cargo builds: published crates from Debian's registry (hexyl, the
markdown crate's file-only binary, pulldown-cmark), and small crates that
deny warnings (in code and in doc tests), break only under rustdoc, or
cannot resolve their dependencies.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tinycrates import Recorder, crate, write_registry

from flakebot_magic.config import DEBIAN_REGISTRY, Settings
from flakebot_magic.errors import NeedsModelError, TestError, ToolError, UpstreamTestError
from flakebot_magic.events import LogLine, Notice
from flakebot_magic.pipeline import Pipeline
from flakebot_magic.records.provenance import provenance_of
from flakebot_magic.stages import search as search_stage
from flakebot_magic.stages.build import BUILD_FLAGS, CAP_LINTS, EDIT_STATE
from flakebot_magic.stages.choose import choose_without_model

pytestmark = pytest.mark.cargo
debian = pytest.mark.skipif(not (DEBIAN_REGISTRY / "hexyl-0.8.0").is_dir(), reason="run `make install` first")

#: a published crate written for an older compiler: it denies warnings, and today's rustc warns about it
DENIES_WARNINGS = r"""#![deny(warnings)]
#[cfg(feature = "no-such-feature-declared")]
fn unused() {}
fn main() {
    let unused_variable = 1;
    println!("still builds");
}
"""


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    cache = os.environ.get("FLAKEBOT_CACHE_DIR")
    return Settings(
        cache_dir=Path(cache) if cache else tmp_path_factory.mktemp("cache"),
        registry=str(DEBIAN_REGISTRY),
        backend="cargo",
    )


def test_the_edit_state_name_is_the_edit_loops() -> None:
    from flakebot_magic.edit.state import STATE_FILE

    assert EDIT_STATE == STATE_FILE  # build.py cannot import it (edit imports build)
    assert all(flag in BUILD_FLAGS for flag in CAP_LINTS)  # capped lints are in the store hash


@debian
def test_hexyl_gives_clean_text_and_takes_bytes_positionally(settings: Settings) -> None:
    events = Recorder()
    hexyl = Pipeline(settings, observers=[events]).run("show a hex dump of a binary file", name="hexyl")
    assert hexyl.crate == "hexyl"
    out = hexyl(input=b"flakebot")
    assert "\x1b" not in out and "66 6c 61 6b 65 62 6f 74" in out
    assert hexyl(b"flakebot") == out  # positional bytes are the input of a tool that reads stdin
    assert "\x1b[" in hexyl(input=b"flakebot", raw=True, color="always")
    choice = provenance_of(hexyl)["choice"]
    assert choice.startswith("hexyl (chosen by fitness): hexyl ships the binary hexyl"), choice


@debian
def test_pulldown_cmark_stays_the_readme_demo(settings: Settings) -> None:
    md = Pipeline(settings).run("Render Markdown text to HTML.", name="md")
    assert md.crate == "pulldown-cmark" and md("# Hi") == "<h1>Hi</h1>\n"


@debian
def test_a_file_only_markdown_tool_says_so_when_given_text(settings: Settings, tmp_path: Path) -> None:
    # the markdown crate's binary reads the file named by its first argument and has no --help:
    # nothing shows it reads one input file, so the text is not guessed into one; the error says what to do
    markdown = Pipeline(settings).run("", crate="markdown", name="markdown_file")
    assert not markdown.reads_stdin
    with pytest.raises(ToolError) as caught:
        markdown("# Hi\n\nsome *text*")
    first = str(caught.value).splitlines()[0]
    assert first.startswith("markdown_file reads files, not text") and "pathlib.Path" in first
    page = tmp_path / "page.md"
    page.write_text("# Hi\n\nsome *text*\n", encoding="utf-8")
    out = markdown(page)
    assert "\x1b" not in out and "<h1" in out and "<em>text</em>" in out


def test_lints_never_fail_an_unedited_published_crate(tmp_path: Path) -> None:
    registry = write_registry(
        tmp_path / "registry",
        [crate("oldlints", description="prints a line", files={"src/main.rs": DENIES_WARNINGS})],
    )
    settings = Settings(cache_dir=tmp_path / "cache", registry=str(registry), backend="cargo")
    tool = Pipeline(settings).run("", crate="oldlints")
    assert tool() == "still builds\n"
    assert list(CAP_LINTS) == [f for f in tool.provenance["flags"] if f in CAP_LINTS]


def test_a_fork_that_cannot_resolve_moves_on_to_the_next_candidate(tmp_path: Path) -> None:
    # a tool reads its input (one that reads nothing is a demo, never deployed as published)
    main = 'use std::io::Read;\nfn main() { let mut s = String::new(); std::io::stdin().read_to_string(&mut s).ok(); println!("%s"); }\n'
    unresolvable = crate(
        "shoutlines",
        description="shout lines of text in capitals",
        manifest='[package]\nname = "shoutlines"\nversion = "0.1.0"\nedition = "2021"\n'
        'description = "shout lines of text in capitals"\nlicense = "MIT"\nkeywords = ["shout", "capitals"]\n'
        '[dependencies]\nno-such-dependency-xyz = "1"\n',
        files={"src/main.rs": main % "never"},
    )
    fine = crate("shouttext", description="shout lines of text in capitals", files={"src/main.rs": main % "SHOUT"})
    registry = write_registry(tmp_path / "registry", [unresolvable, fine])
    settings = Settings(cache_dir=tmp_path / "cache", registry=str(registry), backend="cargo")
    events = Recorder()
    found = search_stage.search(Pipeline(settings).registry, "shout lines of text in capitals", prefer_bin=True)
    assert [c.name for c in found] == ["shoutlines", "shouttext"]  # the unresolvable one ranks first
    tool = Pipeline(settings, observers=[events]).run("shout lines of text in capitals", name="shout")
    assert tool.crate == "shouttext" and tool() == "SHOUT\n"
    notes = [n.message for n in events.of(Notice) if "trying the next candidate" in n.message]
    assert len(notes) == 1 and "shoutlines" in notes[0] and "no-such-dependency-xyz" in notes[0]
    assert "could not be built as published" in provenance_of(tool)["choice"]


# -- today's compiler: rustdoc too (issue 20) ----------------------------------------

#: qrcode's case in small: the crate denies warnings and holds what today's rustc warns about; rustdoc
#: compiles it for the doc tests and fails unless the lint cap reaches it too
DOC_TESTS_UNDER_DENY_WARNINGS = r"""//! Says hello.
#![deny(warnings)]

/// Says hello.
///
/// ```
/// assert_eq!(doclints::hello(), "hello");
/// ```
pub fn hello() -> &'static str {
    let greeting = ("hello"); // unnecessary parentheses: today's rustc warns
    greeting
}
"""
#: a doc test that itself denies warnings and calls what today's rustc deprecates: rustdoc on stable has
#: no way to cap lints inside a doc test (``--doctest-build-arg`` is unstable), so it fails, as the crate's own
DOC_TEST_DENIES_WARNINGS = r"""#![doc(test(attr(deny(warnings))))]

/// Says hello.
///
/// ```
/// let trimmed = " hi".trim_left(); // deprecated: superseded by trim_start
/// assert_eq!(trimmed, "hi");
/// ```
pub fn hello() -> &'static str {
    "hello"
}
"""
#: an error only rustdoc sees: it builds the crate with cfg(doctest) for the doc tests
RUSTDOC_ERROR = r"""#[cfg(doctest)]
compile_error!("only rustdoc sees this: the doc tests do not build");

/// ```
/// assert_eq!(rustdocerr::one(), 1);
/// ```
pub fn one() -> u32 {
    1
}
"""


def test_doc_tests_of_a_crate_that_denies_warnings_pass_on_todays_compiler(tmp_path: Path) -> None:
    main = 'fn main() { println!("{}", doclints::hello()); }\n'
    files = {"src/lib.rs": DOC_TESTS_UNDER_DENY_WARNINGS, "src/main.rs": main}
    registry = write_registry(tmp_path / "registry", [crate("doclints", description="says hello", files=files)])
    settings = Settings(cache_dir=tmp_path / "cache", registry=str(registry), backend="cargo")
    tool = Pipeline(settings).run("", crate="doclints")
    assert tool() == "hello\n"
    assert tool.provenance["tests"]["passed"] >= 1 and tool.provenance["tests"]["failed"] == 0
    assert list(CAP_LINTS) == [f for f in tool.provenance["flags"] if f in CAP_LINTS]
    assert any("rustdocflags" in f for f in tool.provenance["flags"])  # in the store hash


def test_a_doc_test_that_denies_warnings_itself_fails_as_the_crates_own(tmp_path: Path) -> None:
    main = 'fn main() { println!("{}", doclints::hello()); }\n'
    files = {"src/lib.rs": DOC_TEST_DENIES_WARNINGS, "src/main.rs": main}
    registry = write_registry(tmp_path / "registry", [crate("doclints", description="says hello", files=files)])
    settings = Settings(cache_dir=tmp_path / "cache", registry=str(registry), backend="cargo")
    with pytest.raises(UpstreamTestError) as caught:
        Pipeline(settings).run("", crate="doclints")
    assert caught.value.failed == ["src/lib.rs - hello (line 5)"]
    assert "fail on this toolchain: this is the crate's own failure, not one flakebot caused" in str(caught.value)


def test_a_rustdoc_error_renders_as_text_and_is_the_crates_own(tmp_path: Path) -> None:
    main = 'fn main() { println!("{}", rustdocerr::one()); }\n'
    registry = write_registry(
        tmp_path / "registry",
        [crate("rustdocerr", description="one", files={"src/lib.rs": RUSTDOC_ERROR, "src/main.rs": main})],
    )
    settings = Settings(cache_dir=tmp_path / "cache", registry=str(registry), backend="cargo")
    events = Recorder()
    with pytest.raises(UpstreamTestError) as caught:
        Pipeline(settings, observers=[events]).run("", crate="rustdocerr")
    error = caught.value
    message = str(error)
    assert isinstance(error, TestError) and error.upstream
    assert "this is the crate's own failure, not one flakebot caused" in message
    assert "error: only rustdoc sees this: the doc tests do not build" in message and "--> src/lib.rs:2:1" in message
    assert [d.message for d in error.diagnostics][0] == "only rustdoc sees this: the doc tests do not build"
    logged = [e.line for e in events.of(LogLine)]
    assert "error: only rustdoc sees this: the doc tests do not build" in logged
    for text in [message, *logged, *(str(e) for e in events.events)]:
        assert '{"$message_type"' not in text


# -- the five requests of issue 20, as a user types them --------------------------------


@debian
def test_turn_markdown_into_html_deploys_pulldown_cmark_not_a_file_only_binary(settings: Settings) -> None:
    md = Pipeline(settings).run("Turn Markdown into HTML.", name="md_turn")
    assert md.crate == "pulldown-cmark" and md("*flake*") == "<p><em>flake</em></p>\n"
    choice = provenance_of(md)["choice"]
    assert "pulldown-cmark ships the binary pulldown-cmark" in choice, choice
    assert "its own description and binary text cover" in choice


@debian
def test_a_string_safe_as_a_file_name_deploys_sanitize_filename(settings: Settings) -> None:
    safe = Pipeline(settings).run("make a string safe to use as a file name", name="safe_name")
    assert safe.crate == "sanitize-filename"
    assert safe("report: draft/2?.txt") == "report draft2.txt\n"
    choice = provenance_of(safe)["choice"]
    assert "sanitize-filename ships the binary sanitize-filename, and its own description" in choice, choice


@debian
def test_encode_text_as_a_qr_code_chooses_qrcodes_own_binary(settings: Settings) -> None:
    # the choice only: building qrcode (and the image crates its tests need) takes over two minutes here, past
    # what `make test` may add; its doc tests pass with the lint cap (test_doc_tests_of_a_crate_that_denies_...
    # is its case in small), and benchmarks/bench.py --only-search builds and calls it
    registry = Pipeline(settings).registry
    request = "encode text as a QR code"
    choice = choose_without_model(search_stage.search(registry, request, limit=10, prefer_bin=True), request)
    assert (choice.candidate.name, choice.candidate.reads, choice.by) == ("qrcode", "args", "fitness")
    assert choice.reason.startswith("qrcode ships the binary qrencode, and its own description")


@debian
@pytest.mark.parametrize(
    ("request_text", "library"),
    [("convert a TOML file to JSON", "toml"), ("make the text upper case", "heck")],
)
def test_library_requests_say_so_naming_the_library(settings: Settings, request_text: str, library: str) -> None:
    with pytest.raises(NeedsModelError) as caught:
        Pipeline(settings).run(request_text, name="needs_a_model")
    error = caught.value
    assert library in [c.name for c in error.candidates[:5]]
    lines = str(error).splitlines()
    assert len(lines) <= 8 and any(line.startswith(f"  {library} ") for line in lines)
    assert "--model NAME" in lines[-1] and "--crate NAME" in lines[-1]
