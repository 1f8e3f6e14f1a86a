"""The edit loop: scripted sessions against the fake OpenAI server, real cargo, real git.

The scripts are in ``tests/editscripts.py`` (and ``flakebot_magic/testing/scripts/*.json``).
Loop sessions edit ``tinyhex``, a crate without dependencies; the front-door
tests turn Debian's ``sha2`` library into a ``sha256sum`` look-alike.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from editscripts import SCRIPTS, TINYHEX_MAIN, call, in_text, reply, tinyhex_done
from tinyhex_sessions import Session

from flakebot_magic import cli
from flakebot_magic.config import DEBIAN_REGISTRY
from flakebot_magic.edit import FUNCTION_SCHEMAS, EditOutcome
from flakebot_magic.errors import BudgetExhausted, EditError, FlakebotError
from flakebot_magic.events import Notice
from flakebot_magic.host.git import Git
from flakebot_magic.host.process import ProcessRunner
from flakebot_magic.testing.fake_openai import FakeOpenAIServer

# -- sessions on tinyhex (real cargo, real git, the fake server) --------------------------


def _run_tinyhex(root: Path, data: bytes) -> str:
    binary = root / "target" / "flakebot-test" / "debug" / "tinyhex"
    return subprocess.run([str(binary)], input=data, capture_output=True, check=True).stdout.decode()


@pytest.mark.cargo
def test_a_session_turns_the_library_into_a_green_cli(session: Callable[..., Session]) -> None:
    s = session([*tinyhex_done()[:1], reply(call("run_checks")), tinyhex_done()[1]], clippy=True)
    outcome = s.loop.run("print standard input as hex")
    assert isinstance(outcome, EditOutcome)
    assert (outcome.contract.kind, outcome.contract.bin) == ("cli", "tinyhex")
    assert outcome.iterations == 2 and outcome.model_calls == 3
    assert _run_tinyhex(s.root, b"\x00\xff") == "00ff\n"
    results = s.results()
    assert [r.iteration for r in results] == [0, 1, 2]
    assert results[0].passed == 1 and not results[0].green  # the baseline: the library's test, no contract
    assert results[-1].green and results[-1].passed == 2 and results[-1].commit == outcome.head
    assert s.history()[:3] == [
        "Check run 2 (session 1, iteration 2): green: 2 passed, 0 failed, 0 ignored; 0 warning(s)",
        "Check run 1 (session 1, iteration 1): green: 2 passed, 0 failed, 0 ignored; 0 warning(s)",
        "Check run 0 (baseline of edit session 1): contract NOT met: 1 passed, 0 failed, 0 ignored; 0 warning(s)",
    ]
    # the system prompt carries the request, the README, the repo map, Cargo.toml and the contract
    system = s.server.requests[0]["messages"][0]["content"]
    for expected in (
        "print standard input as hex",
        "Hex-encode bytes",
        "src/lib.rs (14 lines): fn to_hex",
        'name = "tinyhex"',
        "[package.metadata.flakebot]",
        "Check run 0",
    ):
        assert expected in system, expected
    assert s.server.requests[0]["tools"] == FUNCTION_SCHEMAS
    assert "Contract: ok" in s.tool_replies(3)[-1]


@pytest.mark.cargo
def test_every_path_escape_is_refused_and_the_model_is_told(session: Callable[..., Session], tmp_path: Path) -> None:
    # a symlink planted before the loop is refused by the build policy before it starts
    # (tests/security/test_policy_session.py); planted during a run, see tests/security/test_symlink_writes.py
    outside = tmp_path / "outside"
    outside.mkdir()

    attempts = [
        call("write_file", path="../escaped.rs", content="x"),
        call("write_file", path=str(outside / "abs.rs"), content="x"),
        call("read_file", path="../../../../etc/passwd"),
        call("write_file", path="src/../../through-dots.rs", content="x"),
        call("write_file", path=".git/hooks/pre-commit", content="#!/bin/sh\necho pwned\n"),
        call("write_file", path=".cargo/config.toml", content="[build]\nrustflags = []\n"),
        call("write_file", path="rust-toolchain.toml", content='[toolchain]\nchannel = "nightly"\n'),
        call("write_file", path="build.rs", content="fn main() {}\n"),
        call(
            "replace_in_file",
            path="Cargo.toml",
            search='license = "MIT"\n',
            replace='license = "MIT"\nbuild = "src/gen.rs"\n',
        ),
        call("delete_file", path="../escaped.rs"),
        call("list_files", path=".."),
    ]
    s = session([reply(*attempts), *tinyhex_done()])
    s.loop.run("print standard input as hex")
    replies = s.tool_replies(2)
    assert len(replies) == len(attempts)
    for attempt, answer in zip(attempts, replies, strict=True):
        assert answer.startswith("error: refused: "), (attempt, answer)
    assert list(outside.iterdir()) == []
    assert not (s.root.parent / "escaped.rs").exists()
    assert not (s.root / ".git" / "hooks" / "pre-commit").exists()
    for refused in (".cargo", "rust-toolchain.toml", "build.rs"):
        assert not (s.root / refused).exists()
    assert "build =" not in (s.root / "Cargo.toml").read_text()


BROKEN_BY_HALF = "fn main() { HALF AN EDIT"


@pytest.mark.cargo
def test_faults_never_apply_half_an_edit(session: Callable[..., Session]) -> None:
    half = reply(call("write_file", path="src/main.rs", content=BROKEN_BY_HALF))
    stalled = reply(call("write_file", path="src/main.rs", content="STALLED REPLY"))
    script = [
        {"fault": "status", "status": 429, "headers": {"retry-after": "0"}},  # the SDK retries it
        {"fault": "reset", "after_chunks": 6, "message": half},  # the stream breaks mid-way
        {"fault": "malformed"},  # an SSE chunk that is not JSON
        reply(call("list_files", path="src")),
        {"role": "assistant", "content": ""},  # an empty reply
        {"fault": "stall", "seconds": 4},  # past the client's 1.5 s: the SDK retries...
        stalled,  # ...so this reply is never delivered
        reply(
            {
                "type": "function",
                "function": {"name": "write_file", "arguments": '{"path": "src/main.rs", "content": '},
            },
            call("run_shell", command="curl evil.example"),
            call("replace_in_file", path="src/lib.rs", search="nothing like this", replace="x"),
            call("replace_in_file", path="src/lib.rs", search="    ", replace="\t"),
        ),
        *tinyhex_done(),
    ]
    s = session(script)
    outcome = s.loop.run("print standard input as hex")
    assert outcome.summary == "tinyhex prints its standard input as hex"
    # the SDK's retry, then two broken replies, list_files, an empty reply, the stall's retry
    assert len(s.server.requests) == 9
    bad_json, unknown, missing, ambiguous = s.tool_replies(8)[-4:]
    assert (
        bad_json.startswith("error: the arguments of write_file are not valid JSON")
        and "nothing was changed" in bad_json
    )
    assert unknown.startswith("error: there is no tool named 'run_shell'")
    # a reply with a broken call runs none of its calls (never half-applied); the others are told so
    assert missing.startswith("not run:") and ambiguous.startswith("not run:")
    every_version = Git(s.root, ProcessRunner())("log", "-p", "--all")
    assert "HALF AN EDIT" not in every_version and "STALLED REPLY" not in every_version
    unusable = [e.message for e in s.events if isinstance(e, Notice) and "unusable" in e.message]
    assert len(unusable) == 3 and "stream broke" in unusable[0] and "empty reply" in unusable[2]
    assert s.server.remaining == 0


@pytest.mark.cargo
def test_without_streaming_too(session: Callable[..., Session]) -> None:
    s = session([{"fault": "malformed"}, {"fault": "reset"}, *tinyhex_done()], stream=False)
    outcome = s.loop.run("print standard input as hex")
    assert outcome.contract.bin == "tinyhex"
    assert all(r["body"].get("stream") in (None, False) for r in s.server.recorded if r["method"] == "POST")


BROKEN_HEX = '    bytes.iter().map(|b| format!("{:02X}", b)).collect()'


@pytest.mark.cargo
@pytest.mark.parametrize("tool_format", ["native", "text"])
def test_the_ratchet_reverts_deleted_emptied_and_failing_tests(
    session: Callable[..., Session], tool_format: str
) -> None:
    from editscripts import TINYHEX_LIB

    without_tests = TINYHEX_LIB.split("#[cfg(test)]")[0]
    emptied = TINYHEX_LIB.replace('assert_eq!(super::to_hex(&[0, 255, 16]), "00ff10");', "// trust me")
    script = [
        reply(call("write_file", path="src/lib.rs", content=without_tests), call("run_checks")),
        reply(
            call(
                "replace_in_file",
                path="src/lib.rs",
                search='    bytes.iter().map(|b| format!("{:02x}", b)).collect()',
                replace=BROKEN_HEX,
            ),
            call("run_checks"),
        ),
        reply(call("write_file", path="src/lib.rs", content=emptied), call("run_checks")),
        *tinyhex_done(),
    ]
    if tool_format == "text":  # a model without function calling: the same session, its calls written as text
        script = [in_text(message) for message in script]
    s = session(script, tool_format=tool_format, timeout=5.0)
    s.loop.run("print standard input as hex")
    assert all(("tools" in body) == (tool_format == "native") for body in s.server.requests)
    reverted = [r for r in s.results() if r.reverted]
    assert [r.reason for r in reverted] == [
        "deleted test `hex_of_bytes`",
        "passing tests went down from 1 to 0",
        "emptied test `hex_of_bytes` (src/lib.rs)",
    ]
    assert "REVERTED: deleted test `hex_of_bytes`" in s.tool_replies(2)[-1]
    assert "back at the best commit" in s.tool_replies(2)[-1]
    assert (s.root / "src" / "lib.rs").read_text() == TINYHEX_LIB
    history = s.history()
    assert sum(line.startswith("Revert check run") for line in history) == 3
    # the refused states are in the history too: the whole session shows
    assert any("REVERTED: passing tests went down" in line for line in history)


@pytest.mark.cargo
def test_machine_applicable_fixes_cost_no_model_call(session: Callable[..., Session]) -> None:
    needs_mut = TINYHEX_MAIN.replace("let mut input", "let input")
    from editscripts import TINYHEX_CONTRACT

    s = session(
        [
            reply(TINYHEX_CONTRACT, call("write_file", path="src/main.rs", content=needs_mut), call("run_checks")),
            reply(call("finish", summary="done")),
        ]
    )
    s.loop.run("print standard input as hex")
    assert len(s.server.requests) == 2
    assert "let mut input" in (s.root / "src" / "main.rs").read_text()
    report = s.tool_replies(2)[-1]
    assert report.startswith("Check run 2: green")
    assert "applied 1 compiler suggestion(s) itself: src/main.rs:11: consider changing this to be mutable" in report
    results = s.results()
    assert [(r.run, r.errors, r.auto_fixed) for r in results[1:3]] == [(1, 1, 0), (2, 0, 1)]
    # HEAD is finish's run, HEAD~1 the run after the fix, HEAD~2 the run that failed
    assert "E0596" in Git(s.root, ProcessRunner())("log", "-1", "--format=%B", "HEAD~2")


def _broken(n: int) -> str:
    return TINYHEX_MAIN.replace("tinyhex::to_hex(&input)", f"tinyhex::to_hex{n}(&input)")


@pytest.mark.cargo
def test_the_iteration_budget_ends_with_the_last_diagnostics_and_keeps_the_workspace(
    session: Callable[..., Session],
) -> None:
    from editscripts import TINYHEX_CONTRACT

    s = session(
        [
            reply(TINYHEX_CONTRACT, call("write_file", path="src/main.rs", content=_broken(1)), call("run_checks")),
            reply(call("write_file", path="src/main.rs", content=_broken(2)), call("run_checks")),
        ],
        max_iterations=2,
    )
    with pytest.raises(BudgetExhausted) as caught:
        s.loop.run("print standard input as hex")
    error = caught.value
    assert error.reason == "iterations" and error.workspace == s.root.resolve()
    assert "used all 2 iterations" in str(error)
    assert "error[E0425] src/main.rs:13:29: cannot find function `to_hex2`" in str(error) and "to_hex2" in str(error)
    assert "to_hex2" in error.diagnostics
    assert s.root.is_dir() and "to_hex2" in (s.root / "src" / "main.rs").read_text()
    assert s.history()[0].startswith("Check run 2 (session 1, iteration 2): build FAILED")


@pytest.mark.cargo
def test_the_same_errors_twice_in_a_row_is_stuck(session: Callable[..., Session]) -> None:
    from editscripts import TINYHEX_CONTRACT

    s = session(
        [
            reply(TINYHEX_CONTRACT, call("write_file", path="src/main.rs", content=_broken(1)), call("run_checks")),
            reply(call("write_file", path="src/main.rs", content="// moved a line\n" + _broken(1)), call("run_checks")),
        ]
    )
    with pytest.raises(EditError, match="stuck: check runs 1 and 2 failed the same way") as caught:
        s.loop.run("print standard input as hex")
    assert caught.value.reason == "stuck" and not isinstance(caught.value, BudgetExhausted)
    assert len(s.server.requests) == 2


@pytest.mark.cargo
def test_the_token_budget(session: Callable[..., Session]) -> None:
    s = session([reply(call("list_files", path="."))], token_budget=50, clippy=False)
    with pytest.raises(BudgetExhausted, match="token budget") as caught:
        s.loop.run("print standard input as hex")
    assert caught.value.reason == "tokens" and len(s.server.requests) == 1


@pytest.mark.cargo
def test_an_endpoint_that_keeps_failing_is_a_model_error(session: Callable[..., Session]) -> None:
    s = session([{"fault": "status", "status": 401, "body": {"error": {"message": "bad key", "type": "auth"}}}])
    with pytest.raises(FlakebotError, match="answered HTTP 401") as caught:
        s.loop.run("print standard input as hex")
    assert type(caught.value).__name__ == "ModelError" and caught.value.stage == "edit"


# -- through the front doors: sha2 from Debian's registry becomes sha256 -----------------------

needs_sha2 = pytest.mark.skipif(
    not (DEBIAN_REGISTRY / "sha2-0.10.5").is_dir(), reason="Debian's sha2 is not installed: run `make install`"
)
REQUEST = "a command that prints the SHA-256 of its standard input"


@dataclass
class Built:
    cache: Path
    tool: dict[str, Any]
    requests: list[Any]
    stderr: str


def _cli(
    args: list[str], script: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[int, dict[str, Any], list[Any], str]:
    with FakeOpenAIServer(script) as server:
        code = cli.main([*args, "--model", "scripted", "--base-url", server.base_url, "--json"])
        requests = server.requests
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else {}), requests, err


@pytest.fixture(scope="module")
def sha_tool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    """The done-when: `flakebot build REQUEST --model scripted --base-url <fake>`, once per module.

    (Module scope has no capsys, so the command's output is captured by hand.)
    """
    cache = tmp_path_factory.mktemp("shacache")
    out, err = io.StringIO(), io.StringIO()
    with (
        FakeOpenAIServer(SCRIPTS / "sha256.json") as server,
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        code = cli.main(
            [
                "build",
                REQUEST,
                "--model",
                "scripted",
                "--base-url",
                server.base_url,
                "--registry",
                str(DEBIAN_REGISTRY),
                "--cache-dir",
                str(cache),
                "--json",
            ]
        )
        requests = server.requests
    assert code == 0, err.getvalue()
    yield Built(cache, json.loads(out.getvalue()), requests, err.getvalue())


def _sha256sum(data: bytes) -> str:
    return subprocess.run(["sha256sum"], input=data, capture_output=True, check=True).stdout.decode()


@needs_sha2
@pytest.mark.cargo
def test_done_when_the_command_builds_a_sha256_tool_after_the_loop_fixed_a_compile_error(sha_tool: Built) -> None:
    binary = sha_tool.tool["binary"]
    assert Path(binary).name == "sha256" and sha_tool.tool["crate"] == "sha2"
    for data in (b"", b"hello\n", os.urandom(100_000)):
        assert subprocess.run([binary], input=data, capture_output=True, check=True).stdout.decode() == _sha256sum(data)
    # the model chose the crate among the candidates first, and the choice is the tool's provenance
    choice = sha_tool.requests[0]
    assert choice["tool_choice"]["function"]["name"] == "choose_crate" and "sha2" in str(choice["messages"])
    assert sha_tool.tool["provenance"]["choice"].startswith("sha2 (chosen by model): sha2 implements SHA-256")
    # the first attempt did not compile; the compiler's diagnostics reached the model in the next request
    assert len(sha_tool.requests) == 3
    second = sha_tool.requests[2]["messages"]
    report = second[-1]["content"]
    assert second[-1]["role"] == "tool"
    assert report.startswith("Check run 1: build FAILED: 1 error(s)")
    assert "error[E0308] src/bin/sha256.rs:8:5: mismatched types" in report
    assert ">    8 |     Sha256::digest(data)" in report
    assert "edit    run 1: build FAILED" in sha_tool.stderr and "edit    ok" in sha_tool.stderr
    # which error, and how long the run took (issue 21)
    assert re.search(
        r"run 1: build FAILED.*; error\[E0308\] src/bin/sha256\.rs:8:5: mismatched types \(\d+\.\ds\)", sha_tool.stderr
    )
    assert "cargo runs in a sandbox: bubblewrap" in sha_tool.stderr or "WITHOUT network isolation" in sha_tool.stderr


@needs_sha2
@pytest.mark.cargo
def test_the_tool_reads_standard_input_through_its_python_client(sha_tool: Built) -> None:
    from flakebot_magic.records.inventory import Inventory

    assert sha_tool.tool["reads_stdin"] is True
    record = next(r for r in Inventory(sha_tool.cache / "tools").all() if r.name == "sha2")
    assert Path(record.binary).name == "sha256"
    workspace = Path(record.workspace)
    log = Git(workspace, ProcessRunner())("log", "--format=%s")
    assert "Check run 1 (session 1, iteration 1): build FAILED: 1 error(s), 0 warning(s)" in log
    assert "Check run 2 (session 1, iteration 2): green: 2 passed" in log


@needs_sha2
@pytest.mark.cargo
def test_follow_up_applies_new_instructions_to_the_existing_tool(
    sha_tool: Built, capsys: pytest.CaptureFixture[str]
) -> None:
    code, tool, requests, err = _cli(
        [
            "build",
            "also accept a --upper flag",
            "--name",
            "sha2",
            "--continue",
            "--registry",
            str(DEBIAN_REGISTRY),
            "--cache-dir",
            str(sha_tool.cache),
        ],
        SCRIPTS / "sha256-upper.json",
        capsys,
    )
    assert code == 0, err
    assert tool["binary"] != sha_tool.tool["binary"] and tool["store_path"] != sha_tool.tool["store_path"]
    upper = subprocess.run([tool["binary"], "--upper"], input=b"abc", capture_output=True, check=True).stdout.decode()
    assert upper == _sha256sum(b"abc").split()[0].upper() + "  -\n"
    # the old tool is untouched, and the new one still agrees with sha256sum
    assert subprocess.run([sha_tool.tool["binary"]], input=b"abc", capture_output=True).stdout.decode() == _sha256sum(
        b"abc"
    )
    assert subprocess.run([tool["binary"]], input=b"abc", capture_output=True).stdout.decode() == _sha256sum(b"abc")
    system = requests[0]["messages"][0]["content"]
    assert "Earlier sessions on this workspace" in system and REQUEST in system
    assert (
        requests[0]["messages"][1]["content"]
        == "Follow-up instructions for the existing tool: also accept a --upper flag"
    )
    log = Git(sha_tool.cache / "workspaces" / "sha2", ProcessRunner())("log", "--format=%s")
    assert "baseline of edit session 2" in log and "baseline of edit session 1" in log
    assert "search  skipped" not in err and "fork    ok" in err


@needs_sha2
def test_continue_without_a_model_or_a_workspace_says_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["build", "also --upper", "--name", "sha2", "--continue", "--cache-dir", str(tmp_path), "--quiet"])
    assert code == 1 and "needs a model" in capsys.readouterr().err
    code, _, _, err = _cli(
        ["build", "also --upper", "--name", "nothere", "--continue", "--cache-dir", str(tmp_path), "--quiet"],
        SCRIPTS / "sha256-upper.json",
        capsys,
    )
    assert code == 1 and "no workspace for a tool named 'nothere'" in err
