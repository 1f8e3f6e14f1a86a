"""Every tool kind is confined wherever flakebot starts it on its own account (issue 33, item 4).

The invariant: a tool of ANY kind in :data:`~flakebot_magic.clients.kinds.KINDS`, started by flakebot without the
person calling it, or with ``confine_tools``, reaches neither the host's loopback services nor ``$HOME``. Each
kind's hostile program (``tests/kindtools.py``) connects to a real listener this test holds on ``127.0.0.1`` and
reads a secret planted in a fake ``$HOME``, then says what it got. Over every door:

* ``examples``: the cell's acceptance examples (:func:`flakebot_magic.stages.accept.run_examples`);
* ``judge``: the judge scoring a candidate of a race (:func:`flakebot_magic.edit.judge.judge`), which runs the
  examples against the candidate's binary;
* ``hidden``: eval's hidden checks (:func:`flakebot_magic.eval.hidden.run_pytest`: a child pytest whose fixture
  loads the tool with ``confine_tools``);
* ``confine_tools``: a call the person makes with the setting on (``load`` of a registered tool);
* ``build``: a build that reads a server's functions when it deploys it (the server starts, once);
* ``help``: the ``--help`` probe of a command-line tool.

Each door's run must say it was refused both (:data:`kindtools.CONFINED`: the program ran and reported), and the
listener must have seen no connection. The control: the same programs, called unconfined by the person, reach
both (so the probe can fail). On main the HTTP rows failed: the service started on the host, reached the listener
and read the secret, with ``confine_tools`` too; the kind that did not exist then (its row is read from the table)
could not be confined by a rule that was not the table's.
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kindtools import CONFINED, HOSTILE, hostile_script, register

from flakebot_magic.clients import make_tool
from flakebot_magic.clients.contract import ToolContract
from flakebot_magic.clients.kinds import KINDS
from flakebot_magic.config import Settings
from flakebot_magic.sandbox import bubblewrap_works

pytestmark = pytest.mark.skipif(bool(bubblewrap_works()), reason=f"no working bubblewrap: {bubblewrap_works()}")


@dataclass
class Host:
    """What a tool must not reach: a listener on the host's loopback, and a secret in ``$HOME``."""

    port: int
    secret: Path
    home: Path
    connections: list[bytes] = field(default_factory=list)


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Host]:
    home = tmp_path / "home"
    home.mkdir()
    secret = home / ".secret"
    secret.write_text("canary-7f3a")
    monkeypatch.setenv("HOME", str(home))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    found = Host(listener.getsockname()[1], secret, home)

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    found.connections.append(conn.recv(1024))
                except OSError:
                    found.connections.append(b"")

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield found
    listener.close()


def _binary(where: Path, kind: str, host: Host) -> Path:
    binary = where / "bin" / "hostile"
    binary.parent.mkdir(parents=True)
    binary.write_text(hostile_script(kind, host.port, host.secret))
    binary.chmod(0o755)
    return binary


def _tool(tmp_path: Path, kind: str, host: Host, **options: Any) -> Any:
    store = tmp_path / "store-entry"
    return make_tool(
        "hostile",
        _binary(store, kind, host),
        crate="hostile",
        version="0.1.0",
        source_hash="0" * 32,
        store_path=store,
        contract={"kind": kind, "bin": "hostile"},
        start=False,
        timeout=30,
        **options,
    )


def _said(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


# -- the doors ------------------------------------------------------------------------------------------------


def door_examples(tmp_path: Path, kind: str, host: Host) -> str:
    from flakebot_magic.stages.accept import run_examples, split_request

    tool = _tool(tmp_path, kind, host)
    try:
        _, examples = split_request(f"Probe the host.\n>>> {HOSTILE[kind][1]}\n{CONFINED}\n")
        report = run_examples(examples, {"hostile": tool})
        (result,) = report.results
        return CONFINED if report.ok else f"the example failed: {result.got}{result.error}"  # ok: it said CONFINED
    finally:
        tool.close()


def door_judge(tmp_path: Path, kind: str, host: Host) -> str:
    """A race's candidate scored by the judge: its examples run against the candidate's binary (a copy)."""
    from flakebot_magic.edit.checkrun import CheckRun
    from flakebot_magic.edit.judge import judge
    from flakebot_magic.host.git import Git
    from flakebot_magic.host.process import ProcessRunner
    from flakebot_magic.sandbox.diagnostics import TestReport
    from flakebot_magic.stages.accept import split_request

    workspace = tmp_path / "candidate"
    workspace.mkdir()
    git = Git(workspace, ProcessRunner())
    git("init", "-q")
    (workspace / "README").write_text("a candidate\n")
    git("add", "README")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    base = git("rev-parse", "HEAD")
    binary = _binary(workspace / "target" / "debug", kind, host)
    run = CheckRun(
        run=1,
        iteration=1,
        built=True,
        tests=TestReport(passed=1),
        binaries={"hostile": binary},
        contract=ToolContract(kind=kind, bin="hostile"),
    )
    _, examples = split_request(f"Probe the host.\n>>> {HOSTILE[kind][1]}\n{CONFINED}\n")
    score = judge(run, workspace, base, examples, git=git, name="hostile", timeout=30)
    return CONFINED if score.examples_passed == 1 else f"the example failed: {score.note or score}"


def door_hidden(tmp_path: Path, kind: str, host: Host) -> str:
    """eval's hidden checks: a child pytest whose fixture loads the registered tool (confine_tools)."""
    from flakebot_magic.eval.hidden import run_pytest
    from flakebot_magic.eval.task import Task, load_task
    from flakebot_magic.host.process import ProcessRunner

    settings = Settings(cache_dir=tmp_path / "cache", registry=str(tmp_path))
    register(settings, "hostile", hostile_script(kind, host.port, host.secret), kind)
    suite = tmp_path / "suite" / "probe"
    suite.mkdir(parents=True)
    out = tmp_path / "said.txt"
    (suite / "task.toml").write_text('name = "hostile"\nrequest = "probe the host"\n')
    (suite / "test_hidden.py").write_text(
        "import json\nfrom pathlib import Path\n\n"
        "def test_probe(tool):\n"
        f"    hostile = tool\n    said = {HOSTILE[kind][1]}\n"
        f"    Path({str(out)!r}).write_text(said if isinstance(said, str) else json.dumps(said))\n"
    )
    task = load_task(suite)
    assert isinstance(task, Task), task
    result = run_pytest(
        task,
        cache_dir=settings.cache_dir,
        tool_name="hostile",
        work=tmp_path / "work",
        runner=ProcessRunner(),
        timeout=120,
    )
    return out.read_text() if out.is_file() else f"the hidden test did not run: {result}"


def door_confine_tools(tmp_path: Path, kind: str, host: Host) -> str:
    from flakebot_magic.manage.tools import load

    settings = Settings(cache_dir=tmp_path / "cache", registry=str(tmp_path), confine_tools=True)
    register(settings, "hostile", hostile_script(kind, host.port, host.secret), kind)
    hostile = load(settings, "hostile")
    try:
        return _said(eval(HOSTILE[kind][1]))  # the test's own call text, with the tool in scope
    finally:
        hostile.close()


def door_build(tmp_path: Path, kind: str, host: Host) -> str:
    """A build reads a server's functions as it deploys it: the server's start-up probe is in its logs."""
    from flakebot_magic.pipeline.deployed import _after_install

    settings = Settings(cache_dir=tmp_path / "cache", registry=str(tmp_path))
    tool = _tool(tmp_path, kind, host)
    try:
        _after_install(tool, "hostile", settings.cache.tools)
        return next((line.split(": ", 1)[1] for line in tool.logs().splitlines() if "started: " in line), tool.logs())
    finally:
        tool.close()


def door_help(tmp_path: Path, kind: str, host: Host) -> str:
    tool = _tool(tmp_path, kind, host)
    return str(tool.help).partition("(")[2].rstrip(")")


DOORS: dict[str, Callable[[Path, str, Host], str]] = {
    "examples": door_examples,
    "judge": door_judge,
    "hidden": door_hidden,
    "confine_tools": door_confine_tools,
    "build": door_build,
    "help": door_help,
}


def _applies(door: str, kind: str) -> bool:
    """A server is started by a build; only a command-line tool has a ``--help`` probe."""
    if door == "build":
        return KINDS[kind].server
    if door == "help":
        return kind == "cli"  # the probe is the command-line client's (clients/cli_tool_help.py)
    return True


CASES = [pytest.param(door, kind, id=f"{kind}-{door}") for kind in KINDS for door in DOORS if _applies(door, kind)]


def test_every_kind_in_the_table_has_a_hostile_program() -> None:
    """A new kind is confined only if this test can attack it: give it a hostile program in tests/kindtools.py."""
    assert set(KINDS) <= set(HOSTILE), f"no hostile program for {sorted(set(KINDS) - set(HOSTILE))}"


@pytest.mark.parametrize(("door", "kind"), CASES)
def test_a_tool_started_on_flakebots_account_reaches_no_loopback_and_no_home(
    tmp_path: Path, host: Host, door: str, kind: str
) -> None:
    said = DOORS[door](tmp_path, kind, host)
    assert host.connections == [], f"{kind} through {door} reached the host's loopback: {host.connections}"
    assert "canary" not in said, f"{kind} through {door} read $HOME: {said}"
    assert said.strip() == CONFINED, f"{kind} through {door} said: {said}"


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_control_an_unconfined_call_reaches_both(tmp_path: Path, host: Host, kind: str) -> None:
    """A call the person makes without confine_tools runs as the person (documented): the probe can fail."""
    hostile = _tool(tmp_path, kind, host)
    try:
        said = _said(eval(HOSTILE[kind][1]))
    finally:
        hostile.close()
    assert "loopback reached" in said and "read canary-7f3a" in said, said
    assert host.connections


def test_a_confined_http_service_is_reached_through_a_private_unix_socket(tmp_path: Path, host: Host) -> None:
    """The socket is in a directory only its owner may enter, and goes with the service."""
    hostile = _tool(tmp_path, "http", host, confine=True)
    try:
        assert hostile.probe() == CONFINED
        socket_path = Path(hostile.socket_path)
        assert socket_path.is_socket() and (socket_path.parent.stat().st_mode & 0o777) == 0o700
        pid = hostile.pid
        assert hostile.where.startswith("in the sandbox")
    finally:
        hostile.close()
    assert not socket_path.parent.exists()
    assert subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode != 0  # gone
