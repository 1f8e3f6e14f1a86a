"""Where a check run's own time goes (issue 23): the bench's edit session on sha2 under cProfile.

    .venv/bin/python benchmarks/profile_checkrun.py [--top 25] [--registry DIR]

Runs :func:`bench.edit_loop_overhead` (the scripted sha2 session, real cargo
in the sandbox) with :mod:`cProfile` on the main thread and prints, per check
run after the baseline, the milliseconds spent in each part of flakebot's own
work: the git commit, the build policy's walks, the ratchet's scan, the
report, the journal, and, inside what the bench counts as cargo's time, the
sandbox's own work around each cargo command (the wrappers' setup, the disk
watch's first walk, the scan for leftover processes, the cgroups). Then the
functions with the most cumulative time.

To count process spawns per check run, run it under strace:
``strace -f -qq -e trace=execve -e signal=none -o trace.txt .venv/bin/python benchmarks/profile_checkrun.py``
and count the lines by program (``grep -o 'execve("[^"]*"' trace.txt | sort | uniq -c``).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench import edit_loop_overhead  # noqa: E402

from flakebot_magic.config import DEBIAN_REGISTRY  # noqa: E402

#: (label, module path fragment, function name): the parts of a check run, by the function that does each
PARTS = (
    ("git commit (CheckRunner.commit)", "edit/checkrun.py", "commit"),
    ("  of which the first import of pygit2", "pygit2/__init__.py", "<module>"),
    ("build policy after cargo (CheckRunner.policy)", "edit/checkrun.py", "policy"),
    ("ratchet scan (Ratchet.violations)", "edit/ratchet.py", "violations"),
    ("ratchet protect (Ratchet.protect)", "edit/ratchet.py", "protect"),
    ("report", "edit/report.py", "report"),
    ("events (CheckRunner.emit)", "edit/checkrun.py", "emit"),
    ("diagnostics parse (parse_cargo_messages)", "sandbox/diagnostics.py", "parse_cargo_messages"),
    ("contract (workspace_contract)", "edit/checkrun.py", "workspace_contract"),
    ("[in cargo time] build policy before cargo (Cargo.fetch)", "sandbox/cargo.py", "fetch"),
    ("[in cargo time] CARGO_HOME prepared (Cargo._cargo_home)", "sandbox/cargo.py", "_cargo_home"),
    ("[in cargo time] wrappers made (Sandbox.command)", "sandbox/command.py", "command"),
    ("[in cargo time] leftover processes, old path (ProcessRunner._stop)", "host/process.py", "_stop"),
    ("[in cargo time] leftover processes (proctree.finish)", "host/proctree.py", "finish"),
    ("[in cargo time] walks of /proc (_group_members)", "host/proctree.py", "_group_members"),
    ("[in cargo time] cgroups removed (Sandbox.release)", "sandbox/command.py", "release"),
    ("[in cargo time] all of ProcessRunner.run", "host/process.py", "run"),
    ("[in cargo time] spawn (fork/exec of the first wrapper)", "host/process.py", "spawn"),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--registry", default=DEBIAN_REGISTRY)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    profile = cProfile.Profile()
    profile.enable()
    found = edit_loop_overhead(args.registry)
    profile.disable()
    runs = int(found["check_runs"]) + 1  # the baseline too: the profile covers the whole session
    stats = pstats.Stats(profile)
    table = stats.stats  # type: ignore[attr-defined]
    print(
        f"bench: {found['own_p50_ms']:.1f} ms own p50 = {found['ratio_p50'] * 100:.1f}% of cargo "
        f"({found['cargo_p50_s'] * 1000:.0f} ms), max {found['ratio_max'] * 100:.1f}%; "
        f"{runs} check runs profiled (baseline included)"
    )
    print(f"{'part':<62} {'calls':>6} {'ms/run':>8}")
    for label, where, name in PARTS:
        calls = total = 0.0
        for (path, _, function), (_, ncalls, _, cumulative, _) in table.items():
            if function == name and path.replace("\\", "/").endswith(where):
                calls += ncalls
                total += cumulative
        print(f"{label:<62} {calls:>6.0f} {total * 1000 / runs:>8.1f}")
    print()
    stats.sort_stats("cumulative").print_stats(args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
