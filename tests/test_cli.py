"""The ``flakebot`` command: search, build, list, clean, and its errors (in process and as a subprocess)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tinycrates import processes_in, write_registry

from flakebot_magic.cli import main
from flakebot_magic.host.cache import CacheLayout

FLAKEBOT = Path(sys.executable).parent / "flakebot"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(write_registry(tmp_path_factory.mktemp("registry"), ["tinyecho", "tinylib", "brokenbin"]))


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # also the default, so a forgotten --cache-dir cannot touch the user's cache
    monkeypatch.setenv("FLAKEBOT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- search -------------------------------------------------------------------------------


def test_search_json(capsys: pytest.CaptureFixture[str], registry: str, cache: Path) -> None:
    code, out, _ = _run(
        capsys,
        "search",
        "uppercase helper library for words",
        "--registry",
        registry,
        "--cache-dir",
        str(cache),
        "--json",
    )
    assert code == 0
    found = json.loads(out)
    assert [c["name"] for c in found] == ["tinylib", "tinyecho"]  # no tool words: no binary boost
    for candidate in found:
        assert {"name", "version", "description", "score", "has_bin"} <= set(candidate)
        assert candidate["score"] > 0
    fields = ("name", "version", "description", "has_bin", "bin_names")
    assert {k: found[1][k] for k in fields} == {
        "name": "tinyecho",
        "version": "0.2.0",
        "description": "Echo words, or shout standard input",
        "has_bin": True,
        "bin_names": ["tinyecho"],
    }
    assert found[0]["has_bin"] is False
    assert (cache / "index").is_dir()


def test_search_limit_and_text_output(capsys: pytest.CaptureFixture[str], registry: str, cache: Path) -> None:
    code, out, _ = _run(capsys, "search", "uppercase helper library for words", "-r", registry, "--limit", "1")
    assert code == 0
    line, *under = out.splitlines()  # one crate: its line, then its description and why, indented under it
    assert line.split()[1:4] == ["tinylib", "0.1.3", "lib"]
    assert under and all(part.startswith(" " * 8) for part in under) and any("why:" in part for part in under)
    assert max(len(part) for part in out.splitlines()) <= 88  # a normal terminal's width


def test_search_without_matches(capsys: pytest.CaptureFixture[str], registry: str, cache: Path) -> None:
    code, out, err = _run(capsys, "search", "quantum chromodynamics", "-r", registry)
    assert (code, out) == (0, "")
    assert "No crate matches 'quantum chromodynamics'." in err
    code, out, _ = _run(capsys, "search", "quantum chromodynamics", "-r", registry, "--json")
    assert (code, json.loads(out)) == (0, [])


def test_search_as_a_subprocess(registry: str, tmp_path: Path) -> None:
    env = {**os.environ, "FLAKEBOT_BACKEND": "cargo"}
    done = subprocess.run(
        [
            str(FLAKEBOT),
            "search",
            "echo words",
            "--registry",
            registry,
            "--cache-dir",
            str(tmp_path / "cache"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found[0]["name"] == "tinyecho" and found[0]["has_bin"] is True
    assert {"name", "version", "description", "score", "has_bin"} <= set(found[0])


# -- build, list, clean -------------------------------------------------------------------------


@pytest.mark.cargo
def test_build_list_and_clean(capsys: pytest.CaptureFixture[str], registry: str, cache: Path) -> None:
    code, out, err = _run(capsys, "build", "--crate", "tinyecho", "--name", "shout", "-r", registry, "--json")
    assert code == 0, err
    tool = json.loads(out)
    assert (tool["name"], tool["crate"], tool["version"], tool["backend"]) == ("shout", "tinyecho", "0.2.0", "cargo")
    assert tool["reads_stdin"] is True
    assert tool["example"] == 'shout("some input text")'
    binary = Path(tool["binary"])
    assert binary == Path(tool["store_path"]) / "bin" / "tinyecho"
    assert binary.is_relative_to(cache / "store")
    assert subprocess.run([binary], input="hi", capture_output=True, text=True).stdout == "HI"
    assert "flakebot: build" in err and "flakebot: deploy" in err  # progress goes to stderr

    code, out, _ = _run(capsys, "list", "--json")
    assert code == 0
    [record] = json.loads(out)
    assert (record["name"], record["crate"], record["store_path"]) == ("shout", "tinyecho", tool["store_path"])
    assert record["workspace"] == str(cache / "workspaces" / "shout")
    code, out, _ = _run(capsys, "show", "shout", "--json")
    shown = json.loads(out)
    assert set(tool) == set(record) == set(shown)  # one JSON shape: tools.tool_json
    # the loaded tool knows how it is called; a listing never runs a tool to find out
    assert tool["usage"] and record["usage"] is None and shown["example"] is None
    assert {k: v for k, v in tool.items() if k not in ("usage", "example", "reads_stdin")} == {
        k: v for k, v in record.items() if k not in ("usage", "example", "reads_stdin")
    }

    unused = cache / "store" / "0123456789abcdef0123456789abcdef-old-1.0.0"
    (unused / "bin").mkdir(parents=True)
    (cache / "workspaces" / "shout" / "target").mkdir(exist_ok=True)
    code, out, _ = _run(capsys, "clean", "--json")
    assert code == 0
    report = json.loads(out)
    assert sorted(report["removed"]) == sorted([str(unused), str(cache / "workspaces" / "shout" / "target")])
    assert Path(tool["store_path"]).is_dir()  # a live tool's entry stays

    code, out, _ = _run(capsys, "clean", "--all")
    assert code == 0
    assert out.splitlines()[-1].startswith("flakebot clean: removed ")
    # the layout's directories stay (made private by every command), empty
    assert not any((cache / "store").iterdir()) and not list((cache / "tools").glob("*.sqlite3"))
    code, out, _ = _run(capsys, "list")
    assert out == "No tools yet. Build one with `flakebot build REQUEST`.\n"


@pytest.mark.cargo
def test_build_text_output_is_the_usage(capsys: pytest.CaptureFixture[str], registry: str, cache: Path) -> None:
    code, out, err = _run(capsys, "build", "--crate", "tinyecho", "-r", registry, "--quiet")
    assert code == 0
    assert err == ""
    assert "tinyecho 0.2.0" in out.splitlines()[0]
    assert "Echo words, or shout standard input" in out
    assert 'tinyecho("some input text"' in out  # how to call it


def test_clean_with_nothing_to_remove(capsys: pytest.CaptureFixture[str], cache: Path) -> None:
    code, out, _ = _run(capsys, "clean")
    assert (code, out) == (0, "flakebot clean: nothing to remove.\n")


# -- errors ---------------------------------------------------------------------------------------


def test_an_error_exits_1_with_the_message_on_stderr(
    capsys: pytest.CaptureFixture[str], registry: str, cache: Path
) -> None:
    code, out, err = _run(capsys, "build", "-r", registry, "--quiet")
    assert (code, out) == (1, "")
    assert err.startswith("flakebot: error: The request is empty. Say what the tool should do")
    assert "Traceback" not in err


def test_cargo_for_no_such_tool_or_subcommand_says_what_to_do(capsys: pytest.CaptureFixture[str], cache: Path) -> None:
    code, out, err = _run(capsys, "cargo", "ghost", "test")
    assert (code, out) == (1, "") and "There is no workspace for a tool named 'ghost'" in err
    code, _, err = _run(capsys, "cargo", "ghost", "install", "ripgrep")
    assert code == 1 and "`cargo install` is not one flakebot runs in a workspace" in err
    code, _, err = _run(capsys, "cargo", "ghost")
    assert code == 1 and "Usage: flakebot cargo NAME SUBCOMMAND" in err
    assert "Traceback" not in err


def test_an_error_with_json_is_also_json_on_stdout(
    capsys: pytest.CaptureFixture[str], registry: str, cache: Path
) -> None:
    code, out, err = _run(capsys, "build", "--crate", "nope", "-r", registry, "--quiet", "--json")
    assert code == 1
    assert json.loads(out) == {
        "error": "SearchError",
        "message": err.removeprefix("flakebot: error: ").rstrip("\n"),
        "workspace": None,
    }
    assert "There is no crate named 'nope'" in err


def test_a_missing_registry_as_a_subprocess(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            str(FLAKEBOT),
            "search",
            "anything",
            "--registry",
            str(tmp_path / "nowhere"),
            "--cache-dir",
            str(tmp_path / "cache"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.startswith(f"flakebot: error: The registry path {tmp_path / 'nowhere'} does not exist")
    assert "Traceback" not in done.stderr


def test_a_usage_mistake_is_argparses_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["frobnicate"])
    assert caught.value.code == 2
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err


# -- managing tools; Ctrl-C ------------------------------------------------------------------


@pytest.mark.cargo
def test_show_logs_stop_after_a_build(capsys: pytest.CaptureFixture[str], registry: str, cache: Path) -> None:
    code, _, _ = _run(capsys, "build", "--registry", registry, "--crate", "tinyecho", "--name", "te", "--quiet")
    assert code == 0
    code, out, _ = _run(capsys, "list")
    assert code == 0 and "tinyecho@0.2.0" in out and "status" in out and "ready" in out
    code, out, _ = _run(capsys, "show", "te", "--json")
    assert code == 0 and json.loads(out)["crate"] == "tinyecho" and len(json.loads(out)["commit"]) == 40
    code, out, _ = _run(capsys, "logs", "te", "--tail", "5")
    assert code == 0 and "build log" in out and "== run ok" in out
    code, out, _ = _run(capsys, "stop", "te")
    assert code == 0 and "nothing to stop" in out
    code, _, err = _run(capsys, "show", "ghost")
    assert code == 1 and "No tool named 'ghost'" in err
    # what the messages advise: built again for its recorded request, not taken from the cache
    before = json.loads(_run(capsys, "show", "te", "--json")[1])
    code, out, err = _run(capsys, "rebuild", "te", "--registry", registry, "--json", "--quiet")
    assert code == 0, err
    after = json.loads(_run(capsys, "show", "te", "--json")[1])
    assert after["name"] == "te" and after["crate"] == "tinyecho" and after["created"] > before["created"]
    code, _, err = _run(capsys, "rebuild", "ghost")
    assert code == 1 and "No tool named 'ghost'" in err


@pytest.mark.cargo
def test_ctrl_c_cancels_the_build_cleanly(tmp_path: Path, cache: Path) -> None:
    slow = write_registry(tmp_path / "slow-registry", ["slowbuild"])
    proc = subprocess.Popen(
        [str(FLAKEBOT), "build", "--registry", str(slow), "--crate", "slowbuild", "--name", "slow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "FLAKEBOT_CACHE_DIR": str(cache)},
    )
    workspace = cache / "workspaces" / "slow"
    deadline = time.monotonic() + 120
    while not (workspace / "build-script-started").exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err.decode()
    assert "flakebot: cancelled: Stopped during `cargo " in err.decode() and str(workspace) in err.decode()
    assert processes_in(workspace) == []


def test_clean_all_stops_running_tools_first(capsys: pytest.CaptureFixture[str], cache: Path) -> None:
    from flakebot_magic.records.inventory import Inventory, ToolRecord

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        Inventory(cache / "tools").save(
            ToolRecord(
                name="svc",
                crate="demo-http",
                version="0.1.0",
                binary="/x",
                store_path="/x",
                source_hash="h",
                checksum="",
                checksum_kind="",
                registry="r",
                workspace="",
                commit="",
                kind="http",
                status="running",
                pid=proc.pid,
                url="http://127.0.0.1:1/",
                started=time.time(),  # stop signals only a process that started no later than recorded
            )
        )
        code, _, err = _run(capsys, "clean", "--all")
        assert code == 0 and "stopped svc" in err
        assert proc.wait(timeout=10) is not None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_clean_removes_the_losing_candidates_of_tools_not_being_built(
    capsys: pytest.CaptureFixture[str], cache: Path
) -> None:
    """``<workspace>/.flakebot-candidates`` goes with the build outputs, unless the tool's build runs; bytes counted."""
    from flakebot_magic.edit import forks
    from flakebot_magic.host.locks import tool_lock
    from flakebot_magic.manage.cleanup import CANDIDATES_DIR
    from flakebot_magic.records.inventory import Inventory, ToolRecord

    assert CANDIDATES_DIR == forks.CANDIDATES_DIR  # one name, though clean does not import the edit loop
    inventory = Inventory(cache / "tools")

    def tool(name: str) -> Path:
        workspace = cache / "workspaces" / name
        (workspace / "target" / "release").mkdir(parents=True)
        (workspace / "target" / "release" / name).write_bytes(b"b" * 500)
        (workspace / "target" / "dep.rlib").write_bytes(b"r" * 100)
        (workspace / "Cargo.toml").write_bytes(b"c" * 50)
        for index, size in ((0, 1000), (1, 2000)):
            candidate = workspace / CANDIDATES_DIR / str(index)
            (candidate / "src").mkdir(parents=True)
            (candidate / "src" / "main.rs").write_bytes(b"m" * size)
        # a candidate's warm target shares a dependency's library with the workspace's; its sources a file
        # the workspace keeps: removing the candidates frees the library (the target goes too), not Cargo.toml
        (workspace / CANDIDATES_DIR / "1" / "target").mkdir()
        os.link(workspace / "target" / "dep.rlib", workspace / CANDIDATES_DIR / "1" / "target" / "dep.rlib")
        os.link(workspace / "Cargo.toml", workspace / CANDIDATES_DIR / "0" / "Cargo.toml")
        store = cache / "store" / f"abc-{name}"
        store.mkdir(parents=True)
        inventory.save(
            ToolRecord(
                name=name,
                crate="tinyhex",
                version="0.1.0",
                binary=str(store / "bin" / name),
                store_path=str(store),
                source_hash="h",
                checksum="",
                checksum_kind="",
                registry="r",
                workspace=str(workspace),
                commit="",
            )
        )
        return workspace

    done, busy = tool("hx"), tool("busy")
    with tool_lock(CacheLayout(cache), "busy"):
        code, out, err = _run(capsys, "clean", "--json", "--cache-dir", str(cache))
    assert code == 0, err
    report = json.loads(out)
    assert report["candidates"] == [str(done / CANDIDATES_DIR)]
    assert report["candidates_freed_bytes"] == 1000 + 2000 + 100  # Cargo.toml's bytes stay in the workspace
    assert report["freed_bytes"] == 500 + 100 + 1000 + 2000
    assert not (done / CANDIDATES_DIR).exists() and not (done / "target").exists()
    assert (done / "Cargo.toml").read_bytes() == b"c" * 50
    # the running build's candidates stay, and clean says why
    assert (busy / CANDIDATES_DIR / "1" / "src" / "main.rs").is_file() and (busy / "target").is_dir()
    kept = [line for line in report["kept"] if CANDIDATES_DIR in line]
    assert kept and "'busy' is still running" in kept[0]
    # with no build running, the text says what the candidates freed
    code, out, _ = _run(capsys, "clean", "--cache-dir", str(cache))
    assert code == 0 and not (busy / CANDIDATES_DIR).exists()
    assert "the losing candidates of 1 tool (.flakebot-candidates): 0.0 MB (3,100 bytes)." in out


# -- what the messages advise, and a closed output (issue 27) ------------------------------------


def _cli_commands() -> set[str]:
    from flakebot_magic.cli import _parser

    actions = [a for a in _parser()._actions if a.dest == "command"]
    return set(actions[0].choices or ())  # type: ignore[arg-type]


def test_every_command_a_message_names_exists() -> None:
    """Every `flakebot X` / `%flakebot X` written anywhere in the package is a command the user can run."""
    import re

    from flakebot_magic.commands import LINE_COMMANDS

    package = Path(__file__).parent.parent / "flakebot_magic"
    line = {usage.split()[0] for usage, _ in LINE_COMMANDS}
    cli = _cli_commands()
    wrong = []
    for source in sorted(package.rglob("*.py")):
        for magic, command in re.findall(r"`(%?)flakebot ([a-z][a-z-]*)(?=[` ])(?! —)", source.read_text()):
            if command not in (line if magic else cli):
                wrong.append(f"{source.relative_to(package)}: `{magic}flakebot {command}`")
    assert not wrong, wrong
    assert "rebuild" in cli  # the messages' own advice, the magic's line command too


def test_a_closed_output_ends_quietly(tmp_path: Path) -> None:
    """`flakebot list --json | true`: the reader is gone, which is no storage error and no traceback."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [str(FLAKEBOT), "list", "--json", "--cache-dir", str(tmp_path / "cache")],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write)
    assert done.returncode in (0, 141), done.stderr
    assert "Traceback" not in done.stderr and "StorageError" not in done.stderr, done.stderr
    assert "disk" not in done.stderr, done.stderr
