"""Each piece of a CLI tool call alone, and each way to start its child, beside a raw ``subprocess.run``.

    .venv/bin/python benchmarks/bench_call_pieces.py [--binary PATH] [--calls N] [--ballast-mb MB]

Part 1, the pieces a call adds to ``subprocess.run``, each alone in a loop
(no child): the guard's lines (two writes, or one), a pidfd opened and closed,
the entry check's two ``lstat`` s, a pipe end as ``io.FileIO`` (an ``fstat``)
or as a bare descriptor, three ``pipe2`` and their closes.

Part 2, whole calls of ``--binary`` (default ``/bin/cat``: input in, output
back), alternated call by call so each sees the same machine: the raw
``subprocess.run``, ``Popen`` with the call's own session and environment,
``spawn`` + ``Exchange`` (``Popen``, the guard) and ``start_call`` +
``Exchange`` (``posix_spawn``, the guard), and ``Popen`` with a
``preexec_fn`` (a ``fork``: page tables copied). ``--ballast-mb`` first
touches that many MB, as a Jupyter kernel holding a model is big: a fork's
cost grows with it, a vfork's (``Popen`` without ``preexec_fn``,
``posix_spawn``) does not.

CPU time of this process (``time.process_time``) and wall time (p50) per
call. A benchmark prints; it asserts nothing.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flakebot_magic.host.environment import allowed_env
from flakebot_magic.host.exchange import Exchange
from flakebot_magic.host.process import PipeEnd, spawn, start_call


def pieces(calls: int, binary: str) -> dict[str, Callable[[], object]]:
    read, write = os.pipe2(os.O_CLOEXEC)
    os.set_blocking(read, False)
    lock, pid = threading.Lock(), os.getpid()
    manifest = str(Path(binary).parent)

    def drain() -> None:
        try:
            while os.read(read, 1 << 16):
                pass
        except BlockingIOError:
            pass

    def two_lines() -> None:
        with lock:
            os.write(write, b"+%d 1\n" % pid)
        with lock:
            os.write(write, b"-%d\n" % pid)
        drain()

    def one_line() -> None:
        with lock:
            os.write(write, b"-%d\n+%d 1\n" % (pid, pid))
        drain()

    def as_file() -> None:
        a, b = os.pipe2(os.O_CLOEXEC)
        io.FileIO(a).close()
        io.FileIO(b, "w").close()

    def as_descriptor() -> None:
        a, b = os.pipe2(os.O_CLOEXEC)
        PipeEnd(a).close()
        PipeEnd(b).close()

    return {
        "the guard: two lines (a write at the start, one at the reap)": two_lines,
        "the guard: one line (the reap's with the next start)": one_line,
        "pidfd_open + close (the exit in the output's poll)": lambda: os.close(os.pidfd_open(pid)),
        "the entry check's two lstat": lambda: (os.lstat(binary), os.lstat(manifest)),
        "a pipe as two io.FileIO (fstat each)": as_file,
        "a pipe as two PipeEnd (bare descriptors)": as_descriptor,
    }


def calls(binary: str) -> dict[str, Callable[[], object]]:
    env = allowed_env()

    return {
        "raw subprocess.run (the floor)": lambda: subprocess.run([binary], input=b"# Hi", capture_output=True),
        "subprocess.run, own session, allowlisted env": lambda: subprocess.run(
            [binary], input=b"# Hi", capture_output=True, start_new_session=True, env=env
        ),
        "spawn (Popen, vfork) + the guard + Exchange": lambda: Exchange(spawn([binary], env=env, stdin=True)).run(
            b"# Hi", 60
        ),
        "start_call (posix_spawn) + the guard + Exchange": lambda: Exchange(start_call([binary], env=env)).run(
            b"# Hi", 60
        ),
    }


def measure(steps: dict[str, Callable[[], object]], rounds: int, batch: int = 1) -> None:
    for fn in steps.values():
        for _ in range(10):
            fn()
    cpu = dict.fromkeys(steps, 0.0)
    wall: dict[str, list[float]] = {label: [] for label in steps}
    for _ in range(rounds):
        for label, fn in steps.items():
            began, clock = time.process_time(), time.perf_counter()
            for _ in range(batch):
                fn()
            cpu[label] += time.process_time() - began
            wall[label].append((time.perf_counter() - clock) / batch)
    floor_cpu, floor_wall = next(iter(cpu.values())), statistics.median(next(iter(wall.values())))
    for label in steps:
        per, p50 = cpu[label] / rounds / batch, statistics.median(wall[label])
        print(
            f"  CPU {per * 1e6:8.1f} us {cpu[label] / floor_cpu:5.2f}x   wall p50 {p50 * 1e6:8.1f} us "
            f"{p50 / floor_wall:5.2f}x   {label}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", default="/bin/cat")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--ballast-mb", type=int, default=0)
    args = parser.parse_args()
    ballast = bytearray(args.ballast_mb * 1024 * 1024)
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1
    load = os.getloadavg()[0]
    print(f"pieces alone, {args.calls * 20} each in batches of 100, alternated (load {load:.1f}):")
    measure(pieces(args.calls, args.binary), args.calls // 5, 100)
    print(f"whole calls of {args.binary}, {args.calls} each, alternated (ballast {args.ballast_mb} MB):")
    steps = calls(args.binary)
    measure(steps, args.calls)
    print("a fork instead (preexec_fn), beside the floor, 50 calls each:")
    binary = args.binary
    measure(
        {
            "raw subprocess.run (the floor)": steps["raw subprocess.run (the floor)"],
            "Popen with a preexec_fn (fork)": lambda: subprocess.run(
                [binary], input=b"# Hi", capture_output=True, preexec_fn=lambda: None
            ),
        },
        50,
    )
    del ballast
    return 0


if __name__ == "__main__":
    sys.exit(main())
