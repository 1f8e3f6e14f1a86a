"""Row "tool output" of the matrix (docs/SECURITY.md): what a tool prints is data, never code, never the person's.

A tool's output reaches a request at two doors: a failing acceptance example's error (the tool's stderr) is
pasted into the follow-up request the edit loop gets, and an eval's ``--feedback`` pastes the hidden checks'
output (a crate's panic message, raw) into the next attempt's request. Before issue 33 both became requests whose
``>>>`` lines were acceptance examples run with ``exec`` in flakebot's process, and the acceptance follow-up was
recorded as the tool's request, so ``flakebot rebuild`` replayed it later with no model at all (the red team's
fourth door). Here each door gets the payload of ``door_payloads`` from the tool's own output: nothing runs, and
the record keeps the person's request, never the follow-up.

Real cargo in the sandbox; the model is the scripted fake server (a test double, not a model).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from door_payloads import assert_nothing_ran, runs_if_code
from editscripts import TINYHEX, call, reply
from scripted_builds import scripted_settings
from tinycrates import crate, write_registry

from flakebot_magic.cli import main as cli_main
from flakebot_magic.pipeline import Pipeline
from flakebot_magic.records.inventory import Inventory
from flakebot_magic.request import BuildRequest, PersonText
from flakebot_magic.testing.fake_openai import FakeOpenAIServer

pytestmark = pytest.mark.cargo

LEAKER = r"""
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help") {
        println!("Usage: leaker [WORDS]...\nPrints its words.");
        return;
    }
    eprintln!("leaker: refusing\n@PAYLOAD@");
    std::process::exit(3);
}
"""
CONTRACT = '\n[package.metadata.flakebot]\nkind = "cli"\nbin = "leaker"\n'
FINISH = reply(call("finish", summary="the tool is as it should be"))


def test_a_failing_examples_output_is_never_run_nor_recorded_nor_replayed(tmp_path: Path) -> None:
    marker = tmp_path / "stderr-ran"
    main = LEAKER.replace("@PAYLOAD@", runs_if_code(marker, "leaker").replace("\\", "\\\\").replace('"', '\\"'))
    manifest = '[package]\nname = "leaker"\nversion = "0.1.0"\nedition = "2021"\nlicense = "MIT"\n' + CONTRACT
    registry = write_registry(tmp_path / "reg", [crate("leaker", manifest=manifest, files={"src/main.rs": main})])
    cell = PersonText("print the words it is given\n>>> leaker('hi')\n'hi\\n'\n")
    with FakeOpenAIServer({"responses": [FINISH] * 12}) as server:
        settings = scripted_settings(tmp_path / "cache", registry, server)
        tool = Pipeline(settings).run(BuildRequest(cell, crate="leaker", name="leaker"))
        follow_ups = [str(r["body"]["messages"]) for r in server.records]
    # the failure came back to the edit loop as words (the model read the tool's stderr, payload and all)
    assert tool.acceptance is not None and not tool.acceptance.ok
    assert any("these acceptance examples from the request fail" in m and "__import__" in m for m in follow_ups)
    assert not marker.exists()
    # the record keeps the person's request, never the follow-up the tool's output wrote
    record = Inventory(settings.cache.tools).get("leaker")
    assert record is not None and record.request == cell.strip()
    assert tool.provenance["request"] == cell.strip()
    # a rebuild replays the recorded request without a model: its ">>>" lines are words (a recorded request is
    # nobody's own words now), and nothing runs
    code = cli_main(["rebuild", "leaker", "--cache-dir", str(settings.cache_dir), "--registry", str(registry)])
    assert code == 0
    assert_nothing_ran(marker, source="a failing example's stderr, recorded and replayed by rebuild")


def _exercise(practice: Path, name: str, stub: str, test: str) -> None:
    root = practice / name
    for sub in (".docs", ".meta", "src", "tests"):
        (root / sub).mkdir(parents=True)
    (root / ".docs" / "instructions.md").write_text("# Instructions\n\nShout: upper-case the text.\n")
    (root / ".meta" / "config.json").write_text(json.dumps({"files": {"test": [f"tests/{name}.rs"]}}))
    (root / "Cargo.toml").write_text(f'[package]\nedition = "2021"\nname = "{name}"\nversion = "1.0.0"\n')
    (root / "src" / "lib.rs").write_text(stub)
    (root / "tests" / f"{name}.rs").write_text(test)


def test_an_evals_feedback_from_the_hidden_checks_runs_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--feedback``: the hidden Rust tests print the model's panic message raw; the next attempt's request holds
    it, as words."""
    marker = tmp_path / "feedback-ran"
    practice = tmp_path / "checkout" / "rust" / "exercises" / "practice"
    _exercise(
        practice,
        "shout",
        'pub fn shout(text: &str) -> String {\n    todo!("shout {text}")\n}\n',
        'use shout::*;\n\n#[test]\nfn lower() {\n    assert_eq!(shout("hey"), "HEY");\n}\n',
    )
    payload = runs_if_code(marker, "shout").replace("\\", "\\\\").replace('"', '\\"')
    panics = f'pub fn shout(_text: &str) -> String {{\n    panic!("\\n{payload}")\n}}\n'
    script = [
        reply(call("write_file", path="src/lib.rs", content=panics), call("finish", summary="shout done")),
        FINISH,
        FINISH,
        FINISH,
    ]
    registry = write_registry(tmp_path / "reg", [TINYHEX])
    with FakeOpenAIServer(script) as server:
        args = ["--polyglot", str(tmp_path / "checkout" / "rust"), "--model", "scripted", "--base-url", server.base_url]
        args += ["--registry", str(registry), "--out", str(tmp_path / "out"), "--attempts", "2", "--feedback"]
        code = cli_main(["eval", *args, "--json"])
        out, err = capsys.readouterr()
        data = json.loads(out) if out.strip() else {}
        requests = [json.dumps(r["messages"]) for r in server.requests]
    attempts = {a["attempt"]: a for a in data["attempts"]}
    assert set(attempts) == {1, 2}, err
    assert "__import__" in attempts[1]["hidden"]["output"]  # the panic message, raw, as the feedback quotes it
    assert any("tests you cannot see" in r and "__import__" in r for r in requests)  # the follow-up read it
    assert_nothing_ran(marker, source="an eval's feedback of the hidden checks' output")
    assert code == 0 and not attempts[2]["passed"]  # an honest failure of the task, not a payload that ran
