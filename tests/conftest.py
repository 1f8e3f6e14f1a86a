"""Shared fixtures, and a guard that keeps every test on 127.0.0.1."""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
from collections.abc import Iterator

import pytest
from hypothesis import settings

# `auto` would pick nix wherever nix is installed, and the generated flakes'
# default nixpkgs (github:) cannot be fetched offline. Tests that exercise the
# nix backend ask for it (and for the stand-in nixpkgs) explicitly; set
# FLAKEBOT_BACKEND yourself to run the whole suite on another backend.
os.environ.setdefault("FLAKEBOT_BACKEND", "cargo")

pytest_plugins = ["flakebot_magic.testing.fixtures"]

# `make test` (the gate CI runs) draws the same examples every run, so a property
# test fails there only for a change, never for a draw; `make test-fast` and a
# plain pytest draw new ones each run, which is where new counterexamples are
# found (and then fixed or kept as an `@example`).
settings.register_profile("gate", derandomize=True, print_blob=True)

# A shell starts a background job (`make test &`, nohup, a CI step sent to the background) with SIGINT
# ignored, and Python then keeps it ignored: the tests of Ctrl-C (a KeyboardInterrupt in this process, SIGINT
# to a child, which inherits the ignoring) would wait out their 30 s commands instead. Ctrl-C is Python's
# default here, however pytest was started.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

_real_connect = socket.socket.connect
_real_create_connection = socket.create_connection


def _is_loopback(address: object) -> bool:
    if isinstance(address, tuple) and address:
        host = address[0]
    else:  # unix sockets and the like never leave the machine
        return True
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _guarded_connect(self: socket.socket, address: object) -> None:
    if not _is_loopback(address):
        raise RuntimeError(f"test tried to reach {address!r}: tests may only talk to 127.0.0.1")
    return _real_connect(self, address)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _advice_for_both() -> Iterator[None]:
    """Each test starts with advice naming both forms, whatever an in-process magic or CLI call said before."""
    from flakebot_magic.commands import advise

    advise("")
    yield
    advise("")


@pytest.fixture(autouse=True)
def _loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any connection beyond loopback fails the test (a real network call is a bug)."""
    monkeypatch.setattr(socket.socket, "connect", _guarded_connect)
