"""``show``: an edit's usage, its candidates and the winner, from the store manifest (or the inventory record).

The record and its manifest are made by hand, as the pipeline writes them;
the command (``flakebot show [--json]``), ``tools.tool_json`` and the magic
(``%flakebot show``) must all present them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

from flakebot_magic import cli
from flakebot_magic.config import Settings
from flakebot_magic.manage.tools import describe, show, tool_json
from flakebot_magic.records.inventory import Inventory, ToolRecord

USAGE = {"prompt_tokens": 52_000, "completion_tokens": 3_100, "cached_tokens": 40_960, "calls": 9, "cost_usd": 0.0712}
CANDIDATES = [
    {
        "index": 0,
        "status": "lost",
        "crate": "tinyhex",
        "score": {
            "contract_met": True,
            "examples_passed": 1,
            "examples_total": 2,
            "tests_passed": 4,
            "tests_failed": 0,
            "clippy_warnings": 2,
            "diff_lines": 40,
        },
    },
    {
        "index": 1,
        "status": "winner",
        "crate": "tinyhex",
        "score": {
            "contract_met": True,
            "examples_passed": 2,
            "examples_total": 2,
            "tests_passed": 5,
            "tests_failed": 0,
            "clippy_warnings": 0,
            "diff_lines": 12,
        },
    },
    {"index": 2, "status": "cancelled", "crate": "hexfmt"},
]


def _save(settings: Settings, name: str, manifest: dict[str, Any], extra: dict[str, Any] | None = None) -> None:
    store = settings.cache_dir / "store" / f"abc-{name}"
    store.mkdir(parents=True)
    base = {"crate": "tinyhex", "version": "0.1.0", "checksum": "c0ffee", "commit": "d" * 40, "backend": "cargo"}
    (store / "manifest.json").write_text(json.dumps({**base, "model": "gpt-test", "iterations": 4, **manifest}))
    Inventory(settings.cache.tools).save(
        ToolRecord(
            name=name,
            crate="tinyhex",
            version="0.1.0",
            binary=str(store / "bin" / "tinyhex"),
            store_path=str(store),
            source_hash="0123456789abcdef",
            checksum="c0ffee",
            checksum_kind="sha256",
            registry="dir:/r",
            workspace="",
            commit="d" * 40,
            created=time.time(),
            request="hex-encode stdin",
            extra=extra or {},
        )
    )


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    settings = Settings(cache_dir=tmp_path / "cache")
    _save(settings, "hx", {"usage": USAGE, "winner": 1, "candidates": CANDIDATES})
    _save(settings, "plain", {})
    # an older record whose manifest lacks them: the inventory record's extra is read instead
    _save(settings, "old", {}, extra={"usage": {"prompt_tokens": 10, "completion_tokens": 2, "cost_usd": None}})
    return settings


def test_tool_json_and_describe_carry_usage_winner_and_candidates(settings: Settings) -> None:
    provenance = tool_json(Inventory(settings.cache.tools).get("hx"), settings)["provenance"]
    assert provenance["usage"] == USAGE and provenance["winner"] == 1 and provenance["candidates"] == CANDIDATES
    assert provenance["model"] == "gpt-test" and provenance["iterations"] == 4  # beside what was there
    assert describe(settings, "hx")["candidates"][1]["score"]["diff_lines"] == 12
    plain = describe(settings, "plain")
    assert not {"usage", "winner", "candidates"} & set(plain)  # a tool built without them shows none
    assert describe(settings, "old")["usage"]["prompt_tokens"] == 10


def test_show_as_text_says_them_in_words(settings: Settings) -> None:
    text = show(settings, "hx").text
    lines = {line.split()[0]: line for line in text.splitlines() if line and not line.startswith(" ")}
    assert lines["usage"].split(None, 1)[1] == (
        "52,000 prompt tokens (40,960 cached) + 3,100 completion tokens, 9 model calls, $0.0712"
    )
    assert lines["winner"].split(None, 1)[1] == "candidate 1"
    candidates = text[text.index("candidates") :].splitlines()
    assert candidates[0].split(None, 1)[1] == (
        "#0 lost  tinyhex  contract met, examples 1/2, 4 tests passed, 2 clippy warnings, 40 diff lines"
    )
    assert candidates[1].strip().startswith("#1 winner  tinyhex  contract met, examples 2/2, 5 tests passed")
    assert candidates[2].strip() == "#2 cancelled  hexfmt"
    # every value starts in one column, the candidates' continuation lines too
    column = lines["crate"].index("tinyhex")
    assert candidates[1].index("#1") == candidates[0].index("#0") == column == lines["usage"].index("52,000")
    assert "'prompt_tokens'" not in text and "{" not in text  # sentences, not JSON
    assert "cost unknown (no price for the model" in show(settings, "old").text


def test_the_command_shows_them_as_json_and_text(settings: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    cache = ["--cache-dir", str(settings.cache_dir)]
    assert cli.main(["show", "hx", "--json", *cache]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["provenance"]["usage"]["cost_usd"] == 0.0712 and shown["provenance"]["winner"] == 1
    assert [c["status"] for c in shown["provenance"]["candidates"]] == ["lost", "winner", "cancelled"]
    assert cli.main(["show", "hx", *cache]) == 0
    out = capsys.readouterr().out
    assert "$0.0712" in out and "candidate 1" in out and "#2 cancelled  hexfmt" in out


@pytest.fixture
def ip(settings: Settings) -> Iterator[InteractiveShell]:
    config = Config()
    config.HistoryManager.enabled = False
    config.FlakebotMagics.cache_dir = str(settings.cache_dir)
    shell = InteractiveShell(config=config)
    shell.extension_manager.load_extension("flakebot_magic")
    yield shell
    shell.cleanup()


@pytest.mark.kernel
def test_the_magic_shows_them(ip: InteractiveShell, settings: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("flakebot", "show hx")
    out = capsys.readouterr().out
    assert out.strip() == show(settings, "hx").text.strip()
    assert "9 model calls, $0.0712" in out and "#1 winner" in out
