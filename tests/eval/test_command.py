"""``flakebot eval`` and ``flakebot_magic.eval.run``: every mistake is a message that says what to do, never a
traceback, and nothing runs before the arguments are checked."""

from __future__ import annotations

from pathlib import Path

import pytest

import flakebot_magic.eval
from flakebot_magic import cli
from flakebot_magic.errors import UsageError
from flakebot_magic.eval.task import BUILTIN_SUITES

STARTER = BUILTIN_SUITES["starter"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--replay", "--model", "m"], "drop --model"),
        (["--replay", "--feedback"], "--feedback needs a model"),
        ([], "Which model?"),
        (["--model", "m", "--model", "m"], "names a model twice"),
        (["--model", "replay"], "kept for --replay"),
        (["--model", "m", "--polyglot", "/nonexistent"], "a suite directory, or --polyglot"),
        (["--model", "m", "--attempts", "0"], "at least 1"),
        (["--replay", "--task", "nope"], "No task 'nope'"),
        (["--model", "m", "--prices", "m=cheap"], "price"),
        (["--model", "m"], "OPENAI_API_KEY"),
        (["--model", "m", "--provider", "nowhere"], "Unknown provider"),
    ],
)
def test_mistakes_are_usage_errors(
    args: list[str], words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in ("FLAKEBOT_MODEL", "FLAKEBOT_BASE_URL", "FLAKEBOT_PROVIDER", "OPENAI_API_KEY"):
        monkeypatch.delenv(variable, raising=False)
    code = cli.main(["eval", str(STARTER), "--out", str(tmp_path / "out"), *args])
    _, err = capsys.readouterr()
    assert code == 1 and err.startswith("flakebot: error: ") and "Traceback" not in err
    assert words in err
    assert not (tmp_path / "out" / "records").exists()  # nothing ran


def test_no_suite_says_where_it_looked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["eval", str(tmp_path / "missing"), "--replay", "--out", str(tmp_path / "out")])
    assert code == 1 and "is not a directory" in capsys.readouterr().err


def test_resume_without_an_eval_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(
        ["eval", str(STARTER), "--reference", "--resume", "--task", "fnv1a", "--out", str(tmp_path / "out")]
    )
    assert code == 1 and "no eval to resume" in capsys.readouterr().err


def test_the_notebook_door_checks_its_options_too(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="Unknown option 'colour'"):
        flakebot_magic.eval.run(STARTER, reference=True, out=tmp_path, colour="red")
    with pytest.raises(UsageError, match="sets rebuild itself"):
        flakebot_magic.eval.run(STARTER, reference=True, out=tmp_path, rebuild=True)
    assert not (tmp_path / "records").exists()
