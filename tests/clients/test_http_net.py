"""Who listens where (:mod:`flakebot_magic.clients.http_net`): netlink and ``/proc/net`` agree, and a socket
remembered as another process's is skipped while a new one of the group is still found."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from flakebot_magic.clients.http_net import _listening_by_netlink, _listening_in_proc, listening_addresses

#: a child in a process group of its own that listens on loopback, prints its port, and waits
LISTENER = """
import socket, sys, time
s = socket.socket(socket.AF_INET6 if sys.argv[1] == "::1" else socket.AF_INET)
s.bind((sys.argv[1], 0))
s.listen()
print(s.getsockname()[1], flush=True)
time.sleep(300)
"""


@pytest.fixture
def listeners() -> Iterator[list[socket.socket]]:
    made: list[socket.socket] = []
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        try:
            sock = socket.socket(family)
            sock.bind((host, 0))
        except OSError:
            continue  # no IPv6 here
        sock.listen()
        made.append(sock)
    yield made
    for sock in made:
        sock.close()


def test_netlink_and_proc_net_see_the_same_listening_sockets(listeners: list[socket.socket]) -> None:
    try:
        by_netlink = _listening_by_netlink()
    except OSError as exc:
        pytest.skip(f"netlink's sock_diag is refused here ({exc}): /proc/net is read instead")
    in_proc = _listening_in_proc()
    mine = {(host, sock.getsockname()[1]) for sock in listeners for host in [sock.getsockname()[0]]}
    assert mine <= set(by_netlink.values())
    # the same sockets by inode, give or take one opened or closed by another program between the two reads
    assert len(set(by_netlink.items()) ^ set(in_proc.items())) <= 2, (by_netlink, in_proc)


def test_a_foreign_socket_is_skipped_and_a_new_one_of_the_group_still_found(
    listeners: list[socket.socket],
) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", LISTENER, "127.0.0.1"], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        foreign: set[str] = set()
        # every listener on the machine is a candidate here (loopback ones too): this process's are not the group's
        found = listening_addresses(child.pid, foreign=foreign)
        assert found == [("127.0.0.1", port)]
        ours = {str(os.fstat(sock.fileno()).st_ino) for sock in listeners}
        assert ours <= foreign
        assert listening_addresses(child.pid, foreign=foreign) == [("127.0.0.1", port)]  # found again: not foreign
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
