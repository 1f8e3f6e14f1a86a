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

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kindtools import CONFINED, DOORS, HOSTILE, Host, applies, make_tool_of, planted, said_by

from flakebot_magic.clients.kinds import KINDS
from flakebot_magic.sandbox import bubblewrap_works

pytestmark = pytest.mark.skipif(bool(bubblewrap_works()), reason=f"no working bubblewrap: {bubblewrap_works()}")


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Host]:
    with planted(tmp_path, monkeypatch) as found:
        yield found


CASES = [pytest.param(door, kind, id=f"{kind}-{door}") for kind in KINDS for door in DOORS if applies(door, kind)]


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
    hostile = make_tool_of(tmp_path, kind, host)
    try:
        said = said_by(eval(HOSTILE[kind][1]))
    finally:
        hostile.close()
    assert "loopback reached" in said and "read canary-7f3a" in said, said
    deadline = time.monotonic() + 10  # the listener's thread takes the connection the tool already made
    while not host.connections and time.monotonic() < deadline:
        time.sleep(0.01)
    assert host.connections


def test_a_confined_http_service_is_reached_through_a_private_unix_socket(tmp_path: Path, host: Host) -> None:
    """The socket is in a directory only its owner may enter, and goes with the service."""
    hostile = make_tool_of(tmp_path, "http", host, confine=True)
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
