"""What issue 19's workspace invariants cost: a candidate's clone without hard links, and the build stage with
the tests run after the release build.

On hexyl 0.8.0 from the Debian registry (real cargo in the sandbox):

* ``clone``: check run 0, then :func:`~flakebot_magic.edit.forks.clone_candidate` 11 times (best and median);
* ``check``: the build stage (:func:`~flakebot_magic.stages.build.check`), cold then warm.

Run it against another checkout to compare (``PYTHONPATH=/path/to/checkout``)::

    .venv/bin/python benchmarks/bench_workspace_paths.py clone
    .venv/bin/python benchmarks/bench_workspace_paths.py check
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from flakebot_magic.edit.checkrun import CheckRunner
from flakebot_magic.edit.files import WorkspaceFiles
from flakebot_magic.edit.forks import clone_candidate
from flakebot_magic.events import EventBus
from flakebot_magic.host.git import Git
from flakebot_magic.host.process import ProcessRunner
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.sandbox import Sandbox
from flakebot_magic.sandbox.cargo import Cargo
from flakebot_magic.sandbox.policy import Baseline, TreePolicy
from flakebot_magic.stages.build import check
from flakebot_magic.stages.fork import fork

REGISTRY = Path("/usr/share/cargo/registry")


def main(what: str) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="flakebot-bench-paths-"))
    try:
        registry = DirectoryRegistry(REGISTRY, tmp / "index")
        runner = ProcessRunner()
        cargo = Cargo(registry, runner)
        bus = EventBus([])
        ws = fork(registry.get("hexyl"), registry, tmp / "ws", "hexyl", runner=runner, bus=bus, cargo=cargo).path
        git = Git(ws, runner)
        if what == "clone":
            checks = CheckRunner(
                WorkspaceFiles(ws, published=Baseline.from_git(git)),
                cargo=cargo.confined_to(Sandbox(ws)),
                git=git,
                bus=bus,
                build_timeout=900,
                test_timeout=900,
            )
            started = time.monotonic()
            checks.cargo_run(0, clippy=False)
            print(f"check run 0: {time.monotonic() - started:.1f} s")
            times = []
            for _ in range(11):
                started = time.monotonic()
                clone_candidate(ws, 0, runner=runner)
                times.append(time.monotonic() - started)
            print(f"clone_candidate: best {min(times):.3f} s, median {statistics.median(times):.3f} s")
        else:
            policy = TreePolicy(False, Baseline.from_git(git))
            for run in ("cold", "warm"):
                started = time.monotonic()
                check(ws, cargo, bus, policy=policy, build_timeout=900, test_timeout=900)
                print(f"build stage ({run}): {time.monotonic() - started:.1f} s")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "clone")
