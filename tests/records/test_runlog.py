"""A tool's log is the log of the build that made it; cache hits and failed attempts keep theirs beside it.

Synthetic runs (events into a :class:`RunLog`) for where each log goes and
what ``list``, ``show`` and ``logs`` then say; a real cargo build for the
property a user relies on: after any cached re-run, ``logs NAME`` still holds
cargo's and the tests' output.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from flakebot_magic.config import Settings
from flakebot_magic.errors import BuildError, Cancelled, UsageError
from flakebot_magic.events import EventBus, RunFinished, StageFinished, StageStarted
from flakebot_magic.manage import tools
from flakebot_magic.records.inventory import Inventory, ToolRecord
from flakebot_magic.records.runlog import (
    Attempt,
    RunLog,
    attempt_log_path,
    attempt_of,
    attempts,
    cached_log_path,
    log_path,
)


def _record(settings: Settings, name: str = "md") -> ToolRecord:
    store = settings.cache.store / "x"  # a tool whose store entry is gone lists as broken (manage/status.py)
    store.mkdir(parents=True, exist_ok=True)
    record = ToolRecord(
        name=name,
        crate="pulldown-cmark",
        version="0.9.2",
        binary=str(store / "bin" / "md"),
        store_path=str(store),
        source_hash="0" * 32,
        checksum="c",
        checksum_kind="tree-sha256",
        registry="dir:/r",
        workspace="/ws/md",
        commit="a" * 40,
        created=time.time() - 3600,
    )
    Inventory(settings.cache.tools).save(record)
    return record


def _run(settings: Settings, name: str, *, deploy: str = "done", error: BaseException | None = None) -> Path | None:
    """One run's events into a RunLog, then saved as the background thread saves it."""
    log = RunLog(settings)
    bus = EventBus([log])
    bus.emit(StageStarted("search"))
    bus.emit(StageFinished("search", "done", "tinyhex 0.1.0"))
    if deploy == "done":
        bus.log("build", "   Compiling tinyhex v0.1.0")
        bus.log("test", "test result: ok. 4 passed; 0 failed")
    bus.emit(StageStarted("deploy"))
    bus.emit(StageFinished("deploy", deploy if error is None else "done"))
    bus.emit(RunFinished(ok=error is None, error=error))
    return log.save(name, request="hex-encode standard input\n", error=error)


def test_each_run_keeps_its_own_log(tmp_path: Path) -> None:
    settings = Settings(cache_dir=tmp_path / "cache")
    _record(settings)
    built = _run(settings, "md")
    assert built == log_path(settings, "md")
    assert Inventory(settings.cache.tools).get("md").log_path == str(built)  # type: ignore[union-attr]
    # a cache hit logs beside it; the tool's log is still the build's
    hit = _run(settings, "md", deploy="cached")
    assert hit == cached_log_path(settings, "md") and "Compiling" not in hit.read_text()
    assert "Compiling tinyhex" in built.read_text()
    assert Inventory(settings.cache.tools).get("md").log_path == str(built)  # type: ignore[union-attr]
    text = tools.logs(settings, "md")
    assert "Compiling tinyhex" in text and "4 passed" in text and str(hit) in text
    # a failed attempt: its own log and record; the tool's log and record as they were
    before = Inventory(settings.cache.tools).get("md")
    failed = _run(settings, "md", error=BuildError("cargo build failed for md:\nerror[E0308]"))
    assert failed == attempt_log_path(settings, "md", "failed")
    assert Inventory(settings.cache.tools).get("md") == before
    text = tools.logs(settings, "md")
    assert text.startswith("== a later build of md failed") and str(failed) in text and "Compiling tinyhex" in text
    assert [row[0] for row in tools.table(settings).rows()] == ["md"]  # md is still its tool: listed once, ready
    # the next success supersedes the attempt
    _run(settings, "md")
    assert attempt_of(settings, "md") is None and not failed.exists()
    assert not tools.logs(settings, "md").startswith("== a later build")


def test_a_build_that_made_no_tool_is_listed_shown_and_logged(tmp_path: Path) -> None:
    settings = Settings(cache_dir=tmp_path / "cache")
    _record(settings)
    kept = tmp_path / "cache" / "workspaces" / ".next" / "hex2-1-1" / "hex2"
    error = Cancelled("Stopped during `cargo build`.", workspace=kept)
    _run(settings, "hex2", error=error)
    attempt = attempt_of(settings, "hex2")
    assert attempt is not None and (attempt.outcome, attempt.crate, attempt.workspace) == (
        "cancelled",
        "tinyhex 0.1.0",
        str(kept),
    )
    listing = tools.table(settings)
    assert [(row[0], row[2], row[5]) for row in listing.rows()] == [
        ("hex2", "tinyhex@0.1.0", "cancelled"),
        ("md", "pulldown-cmark@0.9.2", "ready"),
    ]
    # one JSON shape for both (the API, the dashboard and --json list each entry alike)
    shapes = [set(entry) for entry in listing.data]
    assert shapes[0] == shapes[1] and listing.data[0]["status"] == "cancelled"
    shown = tools.show(settings, "hex2")
    assert "Stopped during `cargo build`." in shown.text and str(kept) in shown.text
    assert "hex-encode standard input" in shown.text and shown.data == listing.data[0]
    assert "\n\n" not in shown.text
    logged = tools.logs(settings, "hex2")
    assert logged.startswith("== hex2 is not a tool: its last build was cancelled") and "search done" in logged
    with pytest.raises(UsageError, match="its last build was cancelled"):
        tools.find(settings, "hex2")  # what load and rebuild say of it
    html = listing._repr_html_()
    assert "hex2" in html and "cancelled" in html


def test_a_run_killed_between_its_log_and_its_record_is_still_found(tmp_path: Path) -> None:
    """The crash point between the two writes: the log is written first, so ``logs`` finds it alone."""
    settings = Settings(cache_dir=tmp_path / "cache")
    _run(settings, "hex3", error=BuildError("no"))
    (settings.cache.attempts / "hex3.json").unlink()  # as if killed right after the log
    assert "search done" in tools.logs(settings, "hex3")
    assert attempts(settings) == []  # nothing listed that cannot be shown


def test_a_cancelled_run_keeps_its_log_by_its_outcome_and_an_older_caches_name_still_reads(tmp_path: Path) -> None:
    """The log of a run that made no tool is named as :func:`~flakebot_magic.events.outcome_of` calls it; one
    per name (the last); and a cancelled run's log an older version named ``NAME.failed.log`` is still shown."""
    settings = Settings(cache_dir=tmp_path / "cache")
    cancelled = _run(settings, "hex5", error=Cancelled("Stopped during `cargo build`."))
    assert cancelled == attempt_log_path(settings, "hex5", "cancelled") and cancelled.exists()
    assert attempt_of(settings, "hex5").log == str(cancelled)  # type: ignore[union-attr]
    assert str(cancelled) in tools.logs(settings, "hex5") and "cancelled" in tools.logs(settings, "hex5")
    failed = _run(settings, "hex5", error=BuildError("no"))  # the next attempt fails: its log replaces that one
    assert failed == attempt_log_path(settings, "hex5", "failed") and not cancelled.exists()
    assert _run(settings, "hex5", error=Cancelled("stopped")) == cancelled and not failed.exists()
    _run(settings, "hex5")  # a success: no attempt log is left
    assert not cancelled.exists() and not failed.exists()
    # an older cache: a cancelled run's log as NAME.failed.log, its record pointing there, or no record at all
    _run(settings, "hex6", error=Cancelled("stopped"))
    old = attempt_log_path(settings, "hex6", "failed")
    attempt_log_path(settings, "hex6", "cancelled").rename(old)
    record = settings.cache.attempts / "hex6.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "log": str(old)}))
    assert "that build's log" in tools.logs(settings, "hex6") and "search done" in tools.logs(settings, "hex6")
    record.unlink()
    assert "search done" in tools.logs(settings, "hex6")


@pytest.mark.parametrize(
    "damage", ["not json", json.dumps([1, 2]), json.dumps({"name": "x"}), json.dumps({"name": "hex4", "at": "x"})]
)
def test_a_damaged_attempt_record_is_ignored(tmp_path: Path, damage: str) -> None:
    settings = Settings(cache_dir=tmp_path / "cache")
    settings.cache.attempts.mkdir(parents=True, exist_ok=True)
    (settings.cache.attempts / "hex4.json").write_text(damage)
    assert attempt_of(settings, "hex4") is None and attempts(settings) == []
    assert tools.table(settings).rows() == []


def test_an_attempt_round_trips(tmp_path: Path) -> None:
    attempt = Attempt("hex", "failed", "cargo build failed", "BuildError", "req", "tinyhex 0.1.0", "/ws", 1.0, "/l")
    assert Attempt.from_json(json.loads(json.dumps(attempt.to_json()))) == attempt
    assert attempt.as_record().status == "failed" and attempt.as_record().extra["error_kind"] == "BuildError"


@pytest.mark.cargo
def test_logs_after_a_cache_hit_still_hold_cargos_and_the_tests_output(tmp_path: Path) -> None:
    from tinycrates import write_registry

    from flakebot_magic.pipeline.background import start_build

    registry = write_registry(tmp_path / "registry", ["tinyecho"])
    settings = Settings(cache_dir=tmp_path / "cache", registry=str(registry), backend="cargo")
    start_build(settings, "shout", crate="tinyecho", name="te").wait()
    built = Inventory(settings.cache.tools).get("te")
    assert built is not None
    for _ in range(2):  # cached re-runs
        start_build(settings, "shout", crate="tinyecho", name="te").wait()
    again = Inventory(settings.cache.tools).get("te")
    assert again is not None and again.created == built.created  # "started" is the build's, not the cache hit's
    assert again.log_path == built.log_path == str(log_path(settings, "te"))
    text = tools.logs(settings, "te", last=None)
    assert "Compiling tinyecho" in text and "test result: ok" in text  # cargo's and the tests' output
    assert str(cached_log_path(settings, "te")) in text
    assert "== deploy cached" in cached_log_path(settings, "te").read_text()


def test_an_argument_refused_before_any_stage_is_no_attempt(tmp_path: Path) -> None:
    """``--name 1bad``: the user saw why at once; list does not grow a failed entry for it."""
    settings = Settings(cache_dir=tmp_path / "cache")
    log = RunLog(settings)
    error = UsageError("--name '1bad' is not a valid Python identifier; try '_1bad'.")
    log(RunFinished(ok=False, error=error))
    assert log.save("1bad", request="x", error=error) == attempt_log_path(settings, "1bad", "failed")
    assert attempts(settings) == [] and tools.table(settings).rows() == []
