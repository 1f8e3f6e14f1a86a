"""The one parser of rustc's JSON diagnostics and of libtest's output (more cases: tests/stages/test_build.py)."""

from __future__ import annotations

import json

import pytest

from flakebot_magic.sandbox.diagnostics import (
    actionable,
    parse_cargo_messages,
    parse_diagnostic_line,
    parse_test_list,
    parse_test_output,
    readable,
)


def _compiler_message(level: str, text: str, *, code: str | None = None, suggestion: str | None = None) -> str:
    span = {
        "file_name": "src/main.rs",
        "byte_start": 20,
        "byte_end": 25,
        "line_start": 3,
        "column_start": 9,
        "is_primary": True,
        "label": "here",
        "suggested_replacement": None,
        "suggestion_applicability": None,
    }
    children = []
    if suggestion is not None:
        children.append(
            {
                "level": "help",
                "message": "consider changing this to be mutable",
                "children": [],
                "spans": [
                    {**span, "suggested_replacement": suggestion, "suggestion_applicability": "MachineApplicable"}
                ],
            }
        )
    message = {
        "level": level,
        "message": text,
        "code": {"code": code} if code else None,
        "spans": [span],
        "children": children,
        "rendered": text,
    }
    return json.dumps(
        {
            "reason": "compiler-message",
            "package_id": "path+file:///ws#x@0.1.0",
            "target": {"name": "x", "kind": ["bin"]},
            "message": message,
        }
    )


def test_the_parser_keeps_what_the_model_needs_and_actionable_drops_repeats_and_summaries() -> None:
    noise = json.dumps(
        {
            "reason": "compiler-message",
            "message": {"level": "error", "message": "aborting due to 1 previous error", "spans": [], "children": []},
        }
    )
    artifact = json.dumps(
        {
            "reason": "compiler-artifact",
            "package_id": "registry+https://x#dep@1.0",
            "fresh": False,
            "target": {"name": "dep", "kind": ["lib"]},
            "executable": None,
            "profile": {"test": False},
        }
    )
    error = _compiler_message("error", "cannot borrow `input` as mutable", code="E0596", suggestion="mut ")
    stdout = "\n".join([error, error, noise, artifact, "not json", _compiler_message("warning", "unused variable")])
    artifacts: list[dict[str, object]] = []
    found, executables, other = parse_cargo_messages(stdout.splitlines(), artifacts=artifacts)
    assert len(found) == 4 and other == ["not json"]
    messages = actionable(found)
    assert [m.level for m in messages] == ["error", "warning"]  # the duplicate and the noise are gone
    first = messages[0]
    assert first.headline() == "error[E0596] src/main.rs:3:9: cannot borrow `input` as mutable"
    assert first.label == "here" and first.notes == ("help: consider changing this to be mutable: `mut`",)
    assert [(s.byte_start, s.byte_end, s.replacement) for s in first.suggestions] == [(20, 25, "mut ")]
    assert executables == {} and len(artifacts) == 1


def test_a_failing_tests_captured_output_is_kept_and_capped() -> None:
    lines = [
        "running 2 tests",
        "test tests::ok ... ok",
        "test tests::breaks ... FAILED",
        "",
        "failures:",
        "",
        "---- tests::breaks stdout ----",
        "thread 'tests::breaks' panicked at src/lib.rs:9:5:",
        *[f"line {n}" for n in range(40)],
        "",
        "failures:",
        "    tests::breaks",
        "",
        "test result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s",
    ]
    report = parse_test_output(lines)
    assert (report.passed, report.failed, report.failures) == (1, 1, ["tests::breaks"])
    output = report.output["tests::breaks"]
    assert output[0] == "thread 'tests::breaks' panicked at src/lib.rs:9:5:" and len(output) == 20


#: what rustdoc printed on cargo's standard error for a crate whose doc-test build failed (rustc 1.95)
RUSTDOC_LINE = json.dumps(
    {
        "$message_type": "diagnostic",
        "message": "only rustdoc sees this: the doc tests do not build",
        "code": None,
        "level": "error",
        "spans": [
            {
                "file_name": "src/lib.rs",
                "byte_start": 16,
                "byte_end": 84,
                "line_start": 2,
                "line_end": 2,
                "column_start": 1,
                "column_end": 69,
                "is_primary": True,
                "label": None,
                "suggested_replacement": None,
                "suggestion_applicability": None,
            }
        ],
        "children": [],
        "rendered": "error: only rustdoc sees this: the doc tests do not build\n --> src/lib.rs:2:1\n  |\n"
        '2 | compile_error!("only rustdoc sees this: the doc tests do not build");\n'
        "  | ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n\n",
    },
    separators=(",", ":"),
)


def test_rustdocs_json_diagnostics_are_parsed_like_rustcs() -> None:
    found = parse_diagnostic_line(RUSTDOC_LINE)
    assert found is not None
    assert (found.level, found.message, found.file, found.line) == (
        "error",
        "only rustdoc sees this: the doc tests do not build",
        "src/lib.rs",
        2,
    )
    assert found.rendered.startswith("error: only rustdoc sees this")
    # cargo's envelope around the same message gives the same diagnostic
    enveloped = json.dumps({"reason": "compiler-message", "message": json.loads(RUSTDOC_LINE)})
    [same], _, _ = parse_cargo_messages([enveloped])
    assert (same.level, same.message, same.file, same.line, same.rendered) == (
        found.level,
        found.message,
        found.file,
        found.line,
        found.rendered,
    )


def test_a_rustdoc_error_renders_as_text() -> None:
    lines = readable(["   Doc-tests x", RUSTDOC_LINE, "error: doctest failed, to rerun pass `--doc`"])
    assert lines[0] == "   Doc-tests x" and lines[-1] == "error: doctest failed, to rerun pass `--doc`"
    assert lines[1:3] == ["error: only rustdoc sees this: the doc tests do not build", " --> src/lib.rs:2:1"]
    assert not any(line.startswith("{") for line in lines)


@pytest.mark.parametrize(
    "line",
    [
        '{"$message_type":"diagnostic","message":',  # cut short
        '{"$message_type":"artifact","artifact":"x.json","emit":"metadata"}',
        '{"$message_type":"diagnostic","spans":"not a list"}',
        "plain text",
    ],
)
def test_other_lines_are_not_diagnostics(line: str) -> None:
    assert parse_diagnostic_line(line) is None
    assert readable([line]) == [line]


LIBTEST = """
running 5 tests
test dup::same ... ok
test other::same ... FAILED
test panics - should panic ... ok
test ign ... ignored, not today
test other::same ... ok

failures:

---- other::same stdout ----

thread 'other::same' (9926) panicked at tests/a.rs:2:33:
assertion `left == right` failed: custom message
  left: 1
 right: 2

failures:
    other::same

test result: FAILED. 3 passed; 1 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.06s
"""


def test_each_test_is_keyed_by_its_full_path_and_a_failure_is_never_overwritten() -> None:
    report = parse_test_output(LIBTEST.splitlines())
    assert report.outcomes == {"dup::same": "ok", "other::same": "FAILED", "panics": "ok", "ign": "ignored"}
    assert "  left: 1" in report.output["other::same"]


def test_the_list_libtest_prints_is_every_test_by_its_path() -> None:
    listed = "dup::same: test\nign: test\nother::same: test\nbench_it: bench\n\n3 tests, 1 benchmark\n"
    assert parse_test_list(listed.splitlines()) == ["dup::same", "ign", "other::same"]
