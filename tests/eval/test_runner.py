"""``flakebot eval`` end to end on the tiny ``tinyhex`` crate: real cargo in the sandbox, real git, real pytest.

What is proven here: a wrong solution fails its hidden tests; a solution that ignores or deletes tests is stopped by
the ratchet and counted failed; an eval killed mid-task resumes with ``--resume`` (finished tasks are not run again;
a replay's task starts over, a model's session continues from its journal); models run side by side, ``--feedback``
continues a failed tool with the hidden failures, costs come from the price table; and the hidden tests never reach
the model or its workspace.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from editscripts import TINYHEX, TINYHEX_CONTRACT, TINYHEX_MAIN, call, reply, tinyhex_done
from evalcli import eval_json
from polling import wait_for
from scripted_builds import ROOT, tiny_registry

from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.testing.fake_openai import FakeOpenAIServer

pytestmark = pytest.mark.cargo

MARKER = "zq-hidden-7731"
HIDDEN = f'''"""Hidden checks of hexer ({MARKER}: never in a prompt, never in a workspace)."""

SECRET = "{MARKER}"


def test_lower_case_hex(tool):
    assert tool(input="zz") == "7a7a\\n"


def test_empty_input(tool):
    assert tool(input="") == "\\n"
'''
TASK = """name = "hexer"
crate = "tinyhex"
request = '''
A command that prints its standard input as lower-case hex.
>>> hexer(input="")
'\\n'
'''
"""

WRONG_MAIN = TINYHEX_MAIN.replace("tinyhex::to_hex(&input)", "tinyhex::to_hex(&input).to_uppercase()")
GOOD = tinyhex_done()
WRONG = [
    reply(TINYHEX_CONTRACT, call("write_file", path="src/main.rs", content=WRONG_MAIN)),
    reply(call("finish", summary="x")),
]
#: tests made to pass by ignoring the crate's own test, or by deleting it: the ratchet reverts both
IGNORES = [
    reply(
        TINYHEX_CONTRACT,
        call("write_file", path="src/main.rs", content=TINYHEX_MAIN),
        call("replace_in_file", path="src/lib.rs", search="    #[test]\n", replace="    #[test]\n    #[ignore]\n"),
        call("finish", summary="done, tests quiet"),
    )
]
DELETES = [
    reply(
        TINYHEX_CONTRACT,
        call("write_file", path="src/main.rs", content=TINYHEX_MAIN),
        call(
            "replace_in_file",
            path="src/lib.rs",
            search=TINYHEX.files["src/lib.rs"].split("#[cfg(test)]")[1],
            replace="\n",
        ),
        call("finish", summary="done, tests gone"),
    )
]


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DirectoryRegistry]:
    yield from tiny_registry(tmp_path_factory, [TINYHEX])


def _suite(root: Path, solutions: dict[str, Any]) -> Path:
    for task, script in solutions.items():
        directory = root / task
        directory.mkdir(parents=True)
        (directory / "task.toml").write_text(TASK)
        (directory / "test_hidden.py").write_text(HIDDEN)
        if script is not None:
            (directory / "solution.json").write_text(json.dumps(script))
    return root


def _by_task(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{a['task']}/{a['model']}/{a['attempt']}": a for a in data["attempts"]}


CHILD = """
import sys
from flakebot_magic import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def _kill(args: list[str], until: Any, what: str, log: Path) -> None:
    """Run ``flakebot eval *args`` in a child process; SIGKILL it once ``until()`` holds (its stderr in ``log``)."""
    with log.open("wb") as stderr:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, "eval", *args], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr
        )
        try:
            wait_for(lambda: until() or child.poll() is not None, timeout=240, what=what)
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(30)
    assert child.returncode == -signal.SIGKILL, f"the eval ended before {what}:\n{log.read_text()}"


def test_wrong_solutions_fail_cheats_are_stopped_by_the_ratchet_and_a_killed_replay_resumes(
    registry: DirectoryRegistry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slow = [{**r, "delay": 1.5} for r in GOOD]  # still running when the others are done and the eval is killed
    suite = _suite(tmp_path / "suite", {"a-good": slow, "b-wrong": WRONG, "c-ignores": IGNORES, "d-deletes": DELETES})
    out = tmp_path / "out"
    args = [str(suite), "--replay", "--registry", str(registry.path), "--out", str(out), "--jobs", "2"]
    records = out / "records" / "replay"

    def midway() -> bool:
        done = {p.parent.name for p in records.glob("*/attempt-1.json")} if records.is_dir() else set()
        return bool(done) and "a-good" not in done

    _kill(args, midway, "a task finished while a-good still runs", tmp_path / "child.log")
    finished = {p.parent.name: p.read_bytes() for p in records.glob("*/attempt-1.json")}
    assert finished and "a-good" not in finished
    # the same command without --resume refuses to mix two evals; a resumed eval must be the same eval
    code, _, err = eval_json(capsys, args)
    assert code == 1 and "--resume" in err
    code, _, err = eval_json(capsys, [*args, "--resume", "--attempts", "2"])
    assert code == 1 and "attempts: 1 then, 2 now" in err
    code, data, err = eval_json(capsys, [*args, "--resume"])
    assert code == 1, err  # a replay in which a task fails: the suite and the harness disagree
    assert f"({len(finished)} finished before)" in err and data["complete"]
    for task, recorded in finished.items():
        assert (records / task / "attempt-1.json").read_bytes() == recorded  # finished: not run again
    found = _by_task(data)
    good, wrong = found["a-good/replay/1"], found["b-wrong/replay/1"]
    assert good["passed"]  # interrupted, then run again from the start: a replay's script starts over too
    assert good["hidden"]["tests"] == {
        "test_hidden.py::test_lower_case_hex": "passed",
        "test_hidden.py::test_empty_input": "passed",
    }
    assert (good["hidden"]["output"], good["hidden"]["error"], good["hidden"]["cause"]) == ("", "", "")
    assert good["proof"]["commit"] and good["proof"]["store_hash"] and good["iterations"] >= 1
    # deployed (green), but the tool is wrong: the hidden tests say so, k of n
    assert wrong["green"] and not wrong["passed"] and wrong["failure"] == "hidden-tests-failed"
    assert wrong["hidden"]["passed"] == 1 and wrong["hidden"]["total"] == 2
    assert "test_lower_case_hex" in wrong["hidden"]["output"]
    assert wrong["cause"].startswith(
        "test_hidden.py::test_lower_case_hex: AssertionError: assert '7A7A\\n' == '7a7a\\n'"
    )
    assert wrong["fault"] == "model"
    for name in ("c-ignores", "d-deletes"):
        cheat = found[f"{name}/replay/1"]
        assert not cheat["passed"] and not cheat["green"] and cheat["failure"] == "ratchet", cheat["message"]
        assert cheat["reverts"] and "ratchet reverted" in cheat["message"]
    assert data["replay"] is True and data["models"][0]["summary"]["pass_at_1"] == 0.25
    assert "REPLAY" in err


def test_a_models_session_killed_mid_task_continues_from_its_journal(
    registry: DirectoryRegistry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the request in flight when the eval is killed takes the delayed finish; the resumed session asks again
    finish = GOOD[1]
    script = [GOOD[0], {**finish, "delay": 30}, finish]
    suite = _suite(tmp_path / "suite", {"hexer": None})
    out = tmp_path / "out"
    with FakeOpenAIServer(script) as server:
        args = [
            str(suite),
            "--model",
            "scripted",
            "--base-url",
            server.base_url,
            "--registry",
            str(registry.path),
            "--out",
            str(out),
        ]
        _kill(args, lambda: len(server.requests) >= 2, "the second model request", tmp_path / "child.log")
        code, data, err = eval_json(capsys, [*args, "--resume"])
        requests = server.requests
    assert code == 0, err
    (attempt,) = data["attempts"]
    assert attempt["passed"] and attempt["model"] == "scripted"
    resumed = requests[2]["messages"]
    assert any("The session was interrupted and is resumed here" in str(m.get("content")) for m in resumed)
    assert resumed[0] == requests[0]["messages"][0]  # the same conversation, not a new one
    # two replies arrived: one before the kill (journalled by the killed process), one after; the request cut by the
    # kill got none
    assert attempt["calls"] == 2


def test_models_side_by_side_with_feedback_prices_and_hidden_tests_never_shown(
    registry: DirectoryRegistry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fix = reply(call("write_file", path="src/main.rs", content=TINYHEX_MAIN), call("finish", summary="lower case now"))
    # jobs 1: "small" takes both its tries (the second continues the first's tool), then "large" its one
    script = [*WRONG, fix, *GOOD]
    suite = _suite(tmp_path / "suite", {"hexer": None})
    out = tmp_path / "out"
    with FakeOpenAIServer(script) as server:
        args = [str(suite), "--model", "small", "--model", "large", "--base-url", server.base_url]
        args += ["--registry", str(registry.path), "--out", str(out), "--attempts", "2", "--feedback"]
        code, data, err = eval_json(capsys, [*args, "--prices", "small=1/2,large=10/20"])
        requests = server.requests
    assert code == 0, err
    found = _by_task(data)
    assert set(found) == {"hexer/small/1", "hexer/small/2", "hexer/large/1"}  # large passed: no second try
    assert found["hexer/small/1"]["failure"] == "hidden-tests-failed" and found["hexer/small/2"]["passed"]
    summaries = {m["model"]: m["summary"] for m in data["models"]}
    assert summaries["small"]["pass_at_k"] == {"1": 0.0, "2": 1.0} and summaries["large"]["pass_at_k"] == {
        "1": 1.0,
        "2": 1.0,
    }
    for model, price in (("small", (1, 2)), ("large", (10, 20))):
        mine = [a for a in data["attempts"] if a["model"] == model]
        expected = sum(a["prompt_tokens"] * price[0] + a["completion_tokens"] * price[1] for a in mine) / 1e6
        assert summaries[model]["cost_usd"] == pytest.approx(expected, rel=1e-6) and expected > 0
    # the follow-up was told what failed, as aider's second try is
    follow_up = requests[2]["messages"]
    assert "tests you cannot see" in follow_up[1]["content"] and "test_lower_case_hex" in follow_up[1]["content"]
    # the model saw the request and its example; never the hidden tests (the marker is in a test that passed)
    assert '>>> hexer(input="")' in requests[0]["messages"][1]["content"]
    assert all(MARKER not in json.dumps(body) for body in requests)
    for attempt in data["attempts"]:
        workspace = Path(attempt["workspace"])
        files = [p for p in workspace.rglob("*") if p.is_file() and ".git" not in p.parts and "target" not in p.parts]
        assert files and all(MARKER not in p.read_text(errors="replace") for p in files)
        assert not any(p.name == "test_hidden.py" for p in files)


def test_a_task_past_its_time_limit_is_stopped_and_counted_as_a_timeout(
    registry: DirectoryRegistry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    suite = _suite(tmp_path / "suite", {"hexer": [{**r, "delay": 20} for r in GOOD]})
    (suite / "hexer" / "task.toml").write_text(TASK + "timeout = 4\n")
    out = tmp_path / "out"
    code, data, err = eval_json(capsys, [str(suite), "--replay", "--registry", str(registry.path), "--out", str(out)])
    assert code == 1, err
    (attempt,) = data["attempts"]
    assert attempt["failure"] == "timeout" and not attempt["passed"]
    assert attempt["seconds"] < 15  # stopped at its limit, not after the model's 20 s
