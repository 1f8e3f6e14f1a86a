"""Where a tool call's time goes beside its floor: CPU time per step, and the system calls of one call.

    .venv/bin/python benchmarks/profile_clients.py [--cache DIR] [--calls N] [--strace]

Builds ``md`` (pulldown-cmark) and ``svc`` (the demo-http fixture) into
``--cache`` (kept, so a second run reuses them), then, alternating call by
call so every step sees the same busy machine:

* the CLI ladder, from a raw ``subprocess.run`` of the binary to ``md("# Hi")``:
  ``Popen`` with the call's own session and environment, flakebot's ``spawn``
  (``Popen`` and the guard), ``start_call`` (``posix_spawn`` and the guard: what
  a call uses), the entry check and the environment alone (each piece alone, and
  the ways to start a child in a big process: ``bench_call_pieces.py``);
* the HTTP ladder, from a raw ``httpx`` keep-alive request to ``svc.greet()``:
  the tool's own ``httpx.Client`` (the size cap), ``svc.request`` (the pool,
  the liveness check), the generated function (the argument check);
* with ``--strace``: the system calls of this process for one call of each,
  beside its raw floor (``strace -f``; the child's own calls are the same).

Numbers are CPU time of this process per call (``time.process_time``): a
shared machine inflates them far less than wall time. A benchmark prints; it
asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flakebot_magic.config import DEBIAN_REGISTRY, Settings  # noqa: E402
from flakebot_magic.pipeline import Pipeline  # noqa: E402

REQUEST = "Render Markdown text to HTML."


def _tools(cache: Path) -> tuple[object, object]:
    from flakebot_magic.testing.overlay import FIXTURES, overlay_registry

    registry = cache / "registry"
    if not registry.exists():
        overlay_registry(registry, [FIXTURES / "demo-http"], Path(DEBIAN_REGISTRY))
    settings = Settings(cache_dir=cache, registry=str(registry), backend="cargo")
    return Pipeline(settings).run(REQUEST, name="md"), Pipeline(settings).run("", crate="demo-http", name="svc")


def ladder(steps: dict[str, Callable[[], object]], calls: int) -> None:
    """Print each step's CPU time per call and its ratio to the first, alternated call by call."""
    for fn in steps.values():
        for _ in range(20):
            fn()
    cpu = dict.fromkeys(steps, 0.0)
    for _ in range(calls):
        for label, fn in steps.items():
            began = time.process_time()
            fn()
            cpu[label] += time.process_time() - began
    floor = next(iter(cpu.values()))
    for label, total in cpu.items():
        print(f"  {total / calls * 1e6:8.1f} us  {total / floor:5.2f}x  {label}")


def cli_steps(md: object) -> dict[str, Callable[[], object]]:
    from flakebot_magic.clients.cli_tool import PLAIN_ENV
    from flakebot_magic.host.exchange import Exchange
    from flakebot_magic.host.process import spawn, start_call

    binary = str(md.binary)  # type: ignore[attr-defined]
    env = md._environment(PLAIN_ENV)  # type: ignore[attr-defined]

    def popen() -> object:
        proc = subprocess.Popen(
            [binary],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env=env,
        )
        return Exchange(proc).run(b"# Hi", 60)

    return {
        "raw subprocess.run (the floor)": lambda: subprocess.run([binary], input=b"# Hi", capture_output=True),
        "Popen(own session, allowlisted env) + Exchange": popen,
        "spawn (Popen + the guard's line) + Exchange": lambda: Exchange(spawn([binary], env=env, stdin=True)).run(
            b"# Hi", 60
        ),
        "start_call (posix_spawn + the guard's line) + Exchange": lambda: Exchange(start_call([binary], env=env)).run(
            b"# Hi", 60
        ),
        'md("# Hi")': lambda: md("# Hi"),  # type: ignore[operator]
        "  of which: the entry check (require_binary)": md.require_binary,  # type: ignore[attr-defined]
        "  of which: the environment": lambda: md._environment(PLAIN_ENV),  # type: ignore[attr-defined]
    }


def http_steps(svc: object, raw: object) -> dict[str, Callable[[], object]]:
    svc.greet(name="a")  # type: ignore[attr-defined]
    own = svc._clients.idle[0]  # type: ignore[attr-defined]
    return {
        "raw httpx keep-alive .get().json() (the floor)": lambda: raw.get("/greet", params={"name": "a"}).json(),  # type: ignore[attr-defined]
        "the tool's own httpx.Client (size cap)": lambda: own.get("/greet", params={"name": "a"}).json(),
        "svc.request() (pool, liveness, loopback recheck)": lambda: svc.request(  # type: ignore[attr-defined]
            "GET", "/greet", params={"name": "a"}
        ).json(),
        'svc.greet(name="a") (argument check, decode)': lambda: svc.greet(name="a"),  # type: ignore[attr-defined]
    }


#: this script's child: one call of a kind between two marker stats, for strace
_ONE_CALL = """
import os, subprocess, sys
sys.path.insert(0, {root!r})
sys.argv = ["x", "--cache", {cache!r}]
import httpx
from profile_clients import _tools
md, svc = _tools(__import__("pathlib").Path({cache!r}))
svc.greet(name="a")
raw = httpx.Client(base_url=svc.base_url, headers={{"Authorization": f"Bearer {{svc.token}}"}}, trust_env=False)
binary = str(md.binary)
calls = {{
    "cli": lambda: md("# Hi"),
    "cliraw": lambda: subprocess.run([binary], input=b"# Hi", capture_output=True),
    "http": lambda: svc.greet(name="a"),
    "httpraw": lambda: raw.get("/greet", params={{"name": "a"}}).json(),
}}
call = calls[{what!r}]
for _ in range(3):
    call()
os.path.exists("/flakebot-mark-start")
call()
os.path.exists("/flakebot-mark-end")
"""


def syscalls(cache: Path, what: str) -> collections.Counter[str]:
    """The system calls of the calling process (not its children) during one call of ``what``."""
    with tempfile.TemporaryDirectory(prefix="fb-strace-") as tmp:
        log = Path(tmp) / "log"
        program = _ONE_CALL.format(root=str(Path(__file__).parent), cache=str(cache), what=what)
        subprocess.run(["strace", "-f", "-o", str(log), sys.executable, "-c", program], capture_output=True, check=True)
        lines = log.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if "flakebot-mark-start" in line)
    end = next(i for i, line in enumerate(lines) if "flakebot-mark-end" in line)
    caller = lines[start].split()[0]
    found: collections.Counter[str] = collections.Counter()
    for line in lines[start + 1 : end]:
        pid, rest = line.split(None, 1)
        name = re.match(r"(\w+)\(", rest)
        if pid == caller and name:
            found[name.group(1)] += 1
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "fb-profile-clients")
    parser.add_argument("--calls", type=int, default=600)
    parser.add_argument("--strace", action="store_true", help="also count the system calls of one call")
    args = parser.parse_args()
    args.cache = args.cache.resolve()
    args.cache.mkdir(parents=True, exist_ok=True)
    import httpx

    from flakebot_magic.clients import stop_all

    md, svc = _tools(args.cache)
    print(f"CPU time of this process per call, {args.calls} calls each, alternated (load {os.getloadavg()[0]:.1f}):")
    print("CLI:")
    ladder(cli_steps(md), args.calls)
    svc.start()  # type: ignore[attr-defined]
    raw = httpx.Client(base_url=svc.base_url, headers={"Authorization": f"Bearer {svc.token}"}, trust_env=False)  # type: ignore[attr-defined]
    try:
        print("HTTP:")
        ladder(http_steps(svc, raw), args.calls * 4)
    finally:
        raw.close()
        stop_all()
    if args.strace:
        if shutil.which("strace") is None:
            print("strace is not installed: no system call counts")
            return 0
        for kind in ("cli", "http"):
            ours, floor = syscalls(args.cache, kind), syscalls(args.cache, kind + "raw")
            extra = {name: ours[name] - floor[name] for name in sorted(ours | floor) if ours[name] != floor[name]}
            print(
                f"system calls of one {kind} call: {sum(ours.values())} (raw: {sum(floor.values())}); differences {extra}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
