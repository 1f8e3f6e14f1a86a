"""The sandbox's cost per cargo command (issue 19): each command plain, and wrapped, side by side.

Every cargo, rustc and clippy process flakebot starts is wrapped by
``Sandbox.command``: ``/bin/sh`` (entering the pids cgroup, opening the seccomp
filter), ``bwrap`` (namespaces, binds, the filter), ``prlimit``. What that
costs is measured on three commands of a small crate with one dependency
(``itoa`` from the Debian registry), each run plain (the same cargo, the same
``CARGO_HOME`` and ``RUSTUP_TOOLCHAIN``, from ``/`` with ``--manifest-path``)
and wrapped, alternated, the median of each:

* ``cargo --version``: startup alone (rustup's proxy, cargo);
* ``cargo metadata --no-deps``: a command that reads the manifest;
* ``cargo build`` with nothing to do: what a check run's commands cost when
  the crate is fresh;

in the build profile (no network, ``CARGO_HOME`` read-only) and, for the
commands that write nothing in the workspace, the fetch profile (the host's
network, the workspace read-only). Reported beside them: the build profile
without the seccomp filter (what the filter adds), and ``Cargo.run`` end to
end (flakebot's own Python around the command: ``CARGO_HOME`` prepared, the
disk and file watch, output read line by line).
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

MANIFEST = '[package]\nname = "benchsandbox"\nversion = "0.1.0"\nedition = "2021"\n\n[dependencies]\nitoa = "1"\n'
MAIN = 'fn main() {\n    println!("{}", itoa::Buffer::new().format(7));\n}\n'


def _p50_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def sandbox_bench(registry_path: str, runs: int = 15) -> dict[str, Any]:
    """Milliseconds (p50) per command: plain, build profile, fetch profile, build profile without seccomp."""
    from flakebot_magic.host.process import ProcessRunner
    from flakebot_magic.registry.directory import DirectoryRegistry
    from flakebot_magic.sandbox import BUILD, FETCH, Sandbox
    from flakebot_magic.sandbox.cargo import Cargo

    scratch = Path(tempfile.mkdtemp(prefix="flakebot-bench-sandbox-"))
    registry = DirectoryRegistry(registry_path, scratch / "index")
    try:
        workspace = scratch / "benchsandbox"
        (workspace / "src").mkdir(parents=True)
        (workspace / "Cargo.toml").write_text(MANIFEST)
        (workspace / "src" / "main.rs").write_text(MAIN)
        sandbox = Sandbox(workspace)
        cargo = Cargo(registry, ProcessRunner(), sandbox)
        warmed = cargo.run("build", cwd=workspace, timeout=600)  # the lock, the dependency, the binary
        if warmed.returncode != 0:
            raise RuntimeError(f"the benchmark crate does not build: {warmed.stderr[-500:]}")
        home = sandbox.cargo_home.resolve()
        manifest = str(workspace / "Cargo.toml")
        env = sandbox.env(cargo.env({"CARGO_HOME": str(home), "CARGO_NET_OFFLINE": "true"}))
        commands = {
            "cargo --version": ["--version"],
            "cargo metadata --no-deps": ["metadata", "--manifest-path", manifest, "--offline", "--no-deps"],
            "cargo build (nothing to do)": ["build", "--manifest-path", manifest, "--offline"],
        }
        plain_seccomp = sandbox.seccomp
        results: dict[str, Any] = {"runs": runs, "commands": {}}
        for label, args in commands.items():
            argv = [cargo.executable, *args]
            variants = {
                "plain": lambda argv=argv: subprocess.run(argv, cwd="/", env=env, capture_output=True),
                "build": lambda argv=argv: subprocess.run(
                    sandbox.command(argv, BUILD, cwd="/"), cwd="/", env=env, capture_output=True
                ),
            }
            if not label.startswith("cargo build"):  # the fetch profile keeps the workspace read-only
                variants["fetch"] = lambda argv=argv: subprocess.run(
                    sandbox.command(argv, FETCH, cwd="/"), cwd="/", env=env, capture_output=True
                )
            samples: dict[str, list[float]] = {name: [] for name in [*variants, "build, no seccomp"]}
            for _ in range(runs):
                for name, run in variants.items():
                    started = time.perf_counter()
                    done = run()
                    samples[name].append(time.perf_counter() - started)
                    if done.returncode != 0:
                        raise RuntimeError(f"{label} ({name}) failed: {done.stderr.decode()[-500:]}")
                sandbox.seccomp = None
                started = time.perf_counter()
                subprocess.run(sandbox.command(argv, BUILD, cwd="/"), cwd="/", env=env, capture_output=True)
                samples["build, no seccomp"].append(time.perf_counter() - started)
                sandbox.seccomp = plain_seccomp
            sandbox.release()
            results["commands"][label] = {name: _p50_ms(values) for name, values in samples.items()}
        # end to end: Cargo.run (the build profile) beside the plain command
        end_to_end: list[float] = []
        for _ in range(runs):
            started = time.perf_counter()
            cargo.run("build", cwd=workspace, timeout=600)
            end_to_end.append(time.perf_counter() - started)
        results["cargo_run_build_ms"] = _p50_ms(end_to_end)
        results["seccomp"] = sandbox.seccomp is not None
        return results
    finally:
        registry.close()
        shutil.rmtree(scratch, ignore_errors=True)


def sandbox_rows(results: dict[str, dict[str, Any]]) -> list[tuple[str, str, str]]:
    """The table rows: per command, plain vs each profile (p50), and what the wrapper adds."""
    found = results.get("sandbox")
    if not found:
        return []
    rows: list[tuple[str, str, str]] = []
    for label, times in found["commands"].items():
        plain, build = times["plain"], times["build"]
        text = f"{plain:.0f} ms plain / **{build:.0f} ms** build profile (+{build - plain:.0f} ms)"
        if "fetch" in times:
            text += f" / {times['fetch']:.0f} ms fetch profile (+{times['fetch'] - plain:.0f} ms)"
        text += f"; without seccomp {times['build, no seccomp']:.0f} ms"
        rows.append((f"sandbox cost per command: `{label}` (p50 of {found['runs']})", text, "-"))
    build = found["commands"]["cargo build (nothing to do)"]
    rows.append(
        (
            '`Cargo.run("build")` end to end, nothing to do (p50) / plain `cargo build`',
            f"{found['cargo_run_build_ms']:.0f} ms / {build['plain']:.0f} ms",
            "-",
        )
    )
    return rows
