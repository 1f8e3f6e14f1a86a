"""Tools by name: the list table, provenance, logs, stop (by recorded process group), the diff."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from flakebot_magic.config import Settings
from flakebot_magic.errors import UsageError
from flakebot_magic.host.git import Git
from flakebot_magic.host.process import ProcessRunner
from flakebot_magic.manage.tools import (
    TOOL_JSON_KEYS,
    describe,
    diffs_of,
    logs,
    show,
    status_of,
    stop,
    stop_all,
    stop_tools,
    table,
    tool_json,
    tool_logs,
)
from flakebot_magic.records.inventory import Inventory, ToolRecord
from flakebot_magic.records.provenance import differences, workspace_diff
from flakebot_magic.records.runlog import log_path


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    settings = Settings(cache_dir=tmp_path / "cache")
    store = settings.cache.store / "abc-tinyecho-0.2.0"  # records are resolved against the cache dir they are in
    store.mkdir(parents=True)
    (store / "manifest.json").write_text(
        json.dumps(
            {
                "crate": "tinyecho",
                "version": "0.2.0",
                "checksum": "c0ffee",
                "commit": "b" * 40,
                "backend": "cargo",
                "rustc": "rustc 1.95.0 (x)\nhost: x86_64",
                "model": "gpt-test",
                "iterations": 3,
            }
        )
    )
    Inventory(settings.cache.tools).save(
        ToolRecord(
            name="te",
            crate="tinyecho",
            version="0.2.0",
            binary=str(store / "bin" / "tinyecho"),
            store_path=str(store),
            source_hash="abcdef0123456789",
            checksum="c0ffee",
            checksum_kind="sha256",
            registry="dir:/r",
            workspace=str(tmp_path / "ws"),
            commit="b" * 40,
            created=time.time(),
            request="echo words",
        )
    )
    return settings


def test_table_has_the_columns(settings: Settings) -> None:
    text = repr(table(settings))
    header, row = text.splitlines()
    for column in ("name", "kind", "crate@version", "hash", "backend", "status", "started"):
        assert column in header
    assert "te" in row and "cli" in row and "tinyecho@0.2.0" in row and "abcdef012345" in row and "ready" in row
    assert "<table" in table(settings)._repr_html_()
    assert "No tools yet" in repr(table(Settings(cache_dir=settings.cache_dir / "none")))


def test_describe_is_the_provenance(settings: Settings) -> None:
    data = describe(settings, "te")
    assert data["crate"] == "tinyecho" and data["commit"] == "b" * 40 and data["checksum"] == "c0ffee"
    assert data["model"] == "gpt-test" and data["iterations"] == 3 and data["rustc"] == "rustc 1.95.0 (x)"
    assert data["request"] == "echo words" and data["store_path"].endswith("abc-tinyecho-0.2.0")
    assert differences(data, {**data, "commit": "c" * 40}) == {"commit": ("b" * 40, "c" * 40)}
    with pytest.raises(UsageError, match=r"No tool named 'nope'.*te"):
        describe(settings, "nope")


def test_logs_of_a_tool_and_of_a_failed_build(settings: Settings) -> None:
    assert "no build log kept" in logs(settings, "te")
    path = log_path(settings, "te")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"line {i}\n" for i in range(500)))
    text = logs(settings, "te", last=10)
    assert "line 499" in text and "line 489" not in text and "490 earlier lines" in text
    log_path(settings, "broken").write_text("== build failed\n")  # no record: the build failed
    assert "build failed" in logs(settings, "broken")
    with pytest.raises(UsageError):
        logs(settings, "never")


def test_stop_a_command_line_tool_says_there_is_nothing_to_stop(settings: Settings) -> None:
    assert "nothing to stop" in stop(settings, "te")


def test_stop_kills_a_recorded_process_group(settings: Settings) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        inventory = Inventory(settings.cache.tools)
        record = inventory.get("te")
        assert record is not None
        record.name, record.kind, record.status, record.pid, record.url = (
            "svc",
            "http",
            "running",
            proc.pid,
            "http://127.0.0.1:1/",
        )
        record.started = time.time()  # stop checks the PID's start time against it
        inventory.save(record)
        assert [status_of(r) for r in inventory.all()] == ["running", "ready"]
        assert stop_all(settings) == [f"stopped svc (process group {proc.pid})"]
        assert proc.wait(timeout=10) == -signal.SIGTERM
        assert inventory.get("svc").status == "stopped"  # type: ignore[union-attr]
        assert stop(settings, "svc") == "svc is not running."
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_running_record_whose_process_is_gone_shows_stopped(settings: Settings) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    inventory = Inventory(settings.cache.tools)
    inventory.update("te", kind="http", status="running", pid=proc.pid)
    assert status_of(inventory.get("te")) == "stopped"  # type: ignore[arg-type]


def test_workspace_diff_hides_long_generated_files(tmp_path: Path) -> None:
    git = Git(tmp_path, ProcessRunner())
    git.init("published")
    (tmp_path / "Cargo.toml").write_text('[package]\nname = "x"\n')
    git.commit("Published source", all_files=True)
    git("branch", "flakebot")
    git("checkout", "-q", "flakebot")
    (tmp_path / "Cargo.toml").write_text('[package]\nname = "x"\nautotests = false\n')
    (tmp_path / "Cargo.lock").write_text("".join(f"line {i}\n" for i in range(100)))
    commit = git.commit("Edit and lock", ["Cargo.toml", "Cargo.lock"])
    assert commit is not None
    diff = workspace_diff(tmp_path, commit)
    assert diff is not None
    assert diff.files == 2 and diff.insertions == 101 and diff.hidden == ["Cargo.lock"]
    assert "+autotests = false" in diff.body and "line 50" not in diff.body
    assert "Cargo.lock" in diff.stat and "2 files changed" in diff.summary
    assert "color:#116329" in diff.to_html()
    assert workspace_diff(tmp_path / "nowhere") is None


def test_a_follow_ups_changes_are_also_shown_against_the_previous_version(tmp_path: Path) -> None:
    git = Git(tmp_path, ProcessRunner())
    git.init("published")
    (tmp_path / "main.rs").write_text("fn main() {}\n")
    git.commit("Published source", all_files=True)
    git("checkout", "-q", "-b", "flakebot")
    (tmp_path / "main.rs").write_text('fn main() { println!("hex"); }\n')
    first = git.commit("The tool", ["main.rs"])
    (tmp_path / "main.rs").write_text('fn main() { println!("HEX"); }\n')
    second = git.commit("--upper", ["main.rs"])
    assert first is not None and second is not None
    tool = SimpleNamespace(name="hex", provenance={"commit": second})
    settings = Settings(cache_dir=tmp_path / "cache")
    Inventory(settings.cache.tools).save(ToolRecord("hex", "c", "1", "", "", "", "", "", "", str(tmp_path), second))
    published, since = diffs_of(settings, tool, since=first)
    assert (
        published.summary.endswith("against the published crate")
        and '+fn main() { println!("HEX"); }' in published.body
    )
    assert since.summary == f"1 file changed, +1 -1 against the previous version ({first[:12]})"
    assert '-fn main() { println!("hex"); }' in since.body and "fn main() {}" not in since.body
    assert [d.summary for d in diffs_of(settings, tool)] == [published.summary]  # not a follow-up: one diff
    assert workspace_diff(tmp_path, second, base="--output=/tmp/x") is None  # a base is a commit id, never an option


def test_show_says_what_is_known_and_nothing_empty(settings: Settings) -> None:
    """A cargo build without a model: no "cost unknown", no empty flake_lock or model line, no blank line."""
    store = Path(Inventory(settings.cache.tools).get("te").store_path)  # type: ignore[union-attr]
    manifest = json.loads((store / "manifest.json").read_text())
    manifest.update(model="", iterations=0, usage={}, candidates=[], winner=None)
    (store / "manifest.json").write_text(json.dumps(manifest))
    Inventory(settings.cache.tools).update("te", request="echo words\nin capitals\n")
    text = show(settings, "te").text
    lines = text.splitlines()
    assert "" not in lines and all(line == line.rstrip() for line in lines)
    assert "cost unknown" not in text and "flake_lock" not in text and "nix_store_path" not in text
    assert "\nmodel" not in text and "usage" not in text
    request = lines.index(next(line for line in lines if line.startswith("request")))
    assert lines[request].endswith("echo words") and lines[request + 1].strip() == "in capitals"
    assert lines[request + 1].startswith(" " * len("request"))  # under the value, not a key of its own


def test_tool_json_is_the_record_and_how_to_reach_it(settings: Settings) -> None:
    record = Inventory(settings.cache.tools).get("te")
    assert record is not None
    data = tool_json(record, settings)
    assert set(data) == set(record.public_json()) | set(TOOL_JSON_KEYS) and "token" not in data
    assert data["status"] == "ready" and data["provenance"]["model"] == "gpt-test"
    assert data["links"] == {
        "self": "/flakebot/api/tools/te",
        "logs": "/flakebot/api/tools/te/logs",
        "stop": "/flakebot/api/tools/te/stop",
    }
    assert (data["usage"], data["example"], data["reads_stdin"]) == (None, None, None)
    assert json.loads(json.dumps(data)) == data


def test_the_management_answers(settings: Settings) -> None:
    shown = show(settings, "te")
    assert shown.data == tool_json(Inventory(settings.cache.tools).get("te"), settings)
    assert "tinyecho" in shown.text and "echo words" in shown.text
    listing = table(settings, empty="nothing here")
    assert [t["name"] for t in listing.data] == ["te"] and listing.text == repr(listing)
    assert table(Settings(cache_dir=settings.cache_dir / "none"), empty="nothing here").text == "nothing here"
    stopped = stop_tools(settings)
    assert (stopped.data, stopped.text) == ([], "No tool is running.")
    one = stop_tools(settings, "te")
    assert one.data == [{"name": "te", "message": one.text, "status": "ready"}] and "nothing to stop" in one.text
    logged = tool_logs(settings, "te", last=5)
    assert logged.data == {"name": "te", "text": logged.text} and "no build log kept" in logged.text


def test_a_tools_process_is_known_by_its_cache_dir(settings: Settings, tmp_path: Path) -> None:
    from flakebot_magic.clients import lifecycle
    from flakebot_magic.manage.tools import tool_of

    record = Inventory(settings.cache.tools).get("te")
    assert record is not None
    other = Settings(cache_dir=tmp_path / "other-cache")  # another cache dir, a tool of the same name
    here, there = tool_of(record, settings, check=False), tool_of(record, other, check=False)  # no entry: keys only
    assert here.home == settings.cache.root and there.home == other.cache.root
    assert lifecycle.process_key(here.home, here.name) != lifecycle.process_key(there.home, there.name)
