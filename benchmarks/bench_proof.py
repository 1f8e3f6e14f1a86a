"""The ways to compile a crate's dependencies once for both the release binary and the proof (issue 23).

    .venv/bin/python benchmarks/bench_proof.py [--crate pulldown-cmark] [--rounds 2]

Each variant runs cold (a fresh target directory) with flakebot's own
:class:`~flakebot_magic.sandbox.cargo.Cargo` in the sandbox, on a fork of the
crate from the offline registry, the variants alternated round by round; the
best round of each is printed beside the bare ``cargo build --release`` (the
floor) as a ratio. Every variant's tests are listed by name (the suite each
ran in, its hash left out) and compared with the set the crate's own
``cargo test`` runs: a variant that runs fewer or other tests is marked so.

Variants:

``bare``            ``cargo build --release`` alone (the floor; no proof)
``split``           the release build beside a debug ``cargo test`` in its own target dir (before issue 23)
``release-tests``   ``cargo build --release``, then ``cargo test --release`` in the same target dir (tests at opt-level 3)
``dev-as-release``  a test profile with release's settings (``CARGO_PROFILE_DEV_*``), same target dir, at once
``split-noinc``     ``split`` with the tests' build not incremental (``CARGO_INCREMENTAL=0``: a cold build has nothing
                    to reuse, and writing the incremental cache costs CPU)
``shipped``         what :func:`flakebot_magic.stages.build.check` does cold: ``split`` with the test build's
                    :data:`~flakebot_magic.stages.build.COLD_TEST_ENV` (not incremental, one codegen unit)
``knob-<name>``     ``split-noinc`` with one knob of the test build (:data:`KNOBS`: codegen units for the dev
                    profile, for the dependencies or the build scripts alone, the dependencies at opt-level 1,
                    stripped symbols, the mold linker)
``split-noinc-nice0`` ``split-noinc`` with the tests' cargo at the release build's priority (not ``nice 10``)
``split-noinc-j1``  ``split-noinc-nice0`` with the tests' cargo at one job (``-j1``) while the release build has two
``one-release``     ONE cargo: ``build --release --lib --bins --tests --examples`` (what ``cargo test --no-run`` builds,
                    and the binaries) in one target dir, every unit in the release profile, so each dependency is
                    compiled once and cargo's scheduler has both cores over the whole graph; then ``cargo test
                    --release`` runs the tests and the doc tests (nothing left to compile but the doc tests)
``one-release-dev0`` ``one-release`` with the packages only the tests need (dev-dependencies and what only they pull
                    in, from ``cargo tree``) at opt-level 0: they are not in the release binary's graph
``shared``          ONE target dir, in sequence: ``cargo build --release``, the binaries copied out (sealed), then
                    ``cargo test --release`` with ``--config`` profile overrides by package: the crate under test at
                    the test profile's settings (opt-level 0, debug assertions, overflow checks) and the packages
                    only the tests need at opt-level 0, so every normal dependency unit of the release build is
                    reused unchanged (the units the test step compiled are counted from cargo's JSON)
``shared-copy``     ``shared`` with the overlap back: the release build's dependency units copied (mtimes kept) into
                    the tests' own target dir as soon as the last of them is done (their number from the bare build
                    of the same round), while the release build compiles the crate; the tests (nice 10) beside it
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flakebot_magic.config import DEBIAN_REGISTRY  # noqa: E402
from flakebot_magic.events import EventBus  # noqa: E402
from flakebot_magic.host.process import Completed, ProcessRunner  # noqa: E402
from flakebot_magic.registry.directory import DirectoryRegistry  # noqa: E402
from flakebot_magic.sandbox.cargo import Cargo  # noqa: E402
from flakebot_magic.sandbox.diagnostics import parse_cargo_messages, parse_test_output  # noqa: E402
from flakebot_magic.stages.build import BUILD_FLAGS, CAP_LINTS, COLD_TEST_ENV, TEST_ENV  # noqa: E402
from flakebot_magic.stages.fork import fork  # noqa: E402

TEST = ("test", "--locked", "--message-format=json", "--no-fail-fast", *CAP_LINTS)
#: release's settings, for the dev and test profiles (the ``dev-as-release`` variant)
DEV_AS_RELEASE = {
    f"CARGO_PROFILE_{p}_{k}": v
    for p in ("DEV", "TEST")
    for k, v in {
        "OPT_LEVEL": "3",
        "DEBUG": "false",
        "DEBUG_ASSERTIONS": "false",
        "OVERFLOW_CHECKS": "false",
        "INCREMENTAL": "false",
    }.items()
}


#: the ``split-noinc`` test build's own setting (issue 23's first pass), which the ``knob-*`` variants add to
NOINC = {"CARGO_INCREMENTAL": "0"}


def _config(*settings: str) -> tuple[str, ...]:
    return tuple(a for setting in settings for a in ("--config", setting))


#: rustflags for the test build with a linker: CAP_LINTS's list and the linker's arguments in one (cargo takes
#: one ``build.rustflags``)
def _rustflags(*flags: str) -> tuple[str, ...]:
    listed = ", ".join(f'"{f}"' for f in ("--cap-lints", "warn", *flags))
    return _config(f"build.rustflags=[{listed}]")


#: knobs of the test build alone, on top of ``split-noinc`` (the release build beside it unchanged): its
#: environment and more cargo arguments; none changes which tests run or the crate's debug assertions
#: and overflow checks (``knob-<name>`` variants)
KNOBS: dict[str, tuple[dict[str, str], tuple[str, ...]]] = {
    "cgu1": ({"CARGO_PROFILE_DEV_CODEGEN_UNITS": "1"}, ()),
    "cgu4": ({"CARGO_PROFILE_DEV_CODEGEN_UNITS": "4"}, ()),
    "cgu16": ({"CARGO_PROFILE_DEV_CODEGEN_UNITS": "16"}, ()),
    "deps-opt1": ({}, _config('profile.dev.package."*".opt-level=1')),
    "deps-cgu1": ({}, _config('profile.dev.package."*".codegen-units=1')),
    "build-cgu1": ({}, _config("profile.dev.build-override.codegen-units=1")),
    "strip": ({"CARGO_PROFILE_DEV_STRIP": "symbols"}, ()),
    "mold": ({}, _rustflags("-C", "link-arg=-fuse-ld=mold")),
}


def root_override(crate: str) -> tuple[str, ...]:
    """cargo ``--config`` giving the crate's own targets the test profile's settings inside ``--release``."""
    settings = {"opt-level": "0", "debug-assertions": "true", "overflow-checks": "true", "debug": "false"}
    return tuple(
        arg
        for key, value in settings.items()
        for arg in ("--config", f'profile.release.package."{crate}".{key}={value}')
    )


def test_names(stdout: str) -> set[str]:
    """The tests a ``cargo test`` ran, by name (:attr:`~flakebot_magic.sandbox.diagnostics.TestReport.ran`)."""
    return set(parse_test_output(stdout.splitlines()).ran)


def dev_only_opt0(b: Bench) -> tuple[str, ...]:
    """cargo ``--config`` putting every package only the tests need at opt-level 0 (``cargo tree`` run in the
    sandbox; its time counts)."""
    return tuple(
        a for name in sorted(dev_only(b)) for a in ("--config", f'profile.release.package."{name}".opt-level=0')
    )


def dev_only(b: Bench) -> set[str]:
    """The packages only the tests need, by name (``cargo tree`` run in the sandbox; its time counts)."""

    def names(edges: str) -> set[str]:
        done = b.cargo.run(
            "tree",
            "--locked",
            "-e",
            edges,
            "--prefix",
            "none",
            "--no-dedupe",
            "--format",
            "{p}",
            cwd=b.workspace,
            timeout=600,
        )
        return {line.split()[0] for line in done.stdout.splitlines() if line.strip()}

    return names("normal,build,dev") - names("normal,build")


def artifacts(stdout: str) -> list[dict[str, Any]]:
    """cargo's ``compiler-artifact`` messages."""
    found: list[dict[str, Any]] = []
    parse_cargo_messages(stdout.splitlines(), artifacts=found)
    return found


def compiled_units(tested: str, built: str) -> dict[str, int]:
    """The units a ``cargo test`` after ``cargo build --release`` in the same target dir compiled or reused (fresh),
    by kind: the crate's own (a path package), the release build's packages, the packages only the tests need."""

    released = {str(a.get("package_id")) for a in artifacts(built)}
    counts = {"own compiled": 0, "release deps reused": 0, "release deps compiled again": 0, "test-only compiled": 0}
    for a in artifacts(tested):
        package = str(a.get("package_id", ""))
        if package.startswith("path+"):  # the fork: the only path package
            counts["own compiled"] += not a.get("fresh")
        elif package in released:
            counts["release deps reused" if a.get("fresh") else "release deps compiled again"] += 1
        else:
            counts["test-only compiled"] += not a.get("fresh")
    return counts


def _number(text: str) -> bool:
    return text.replace(".", "", 1).isdigit()


class Bench:
    def __init__(self, registry: str, crate: str, work: Path) -> None:
        self.registry = DirectoryRegistry(registry, work)
        self.runner = ProcessRunner()
        self.cargo = Cargo(self.registry, self.runner)
        self.workspace = fork(
            self.registry.get(crate),
            self.registry,
            work / "workspaces",
            "proof",
            runner=self.runner,
            bus=EventBus(),
            cargo=self.cargo,
        ).path
        self.round = 0
        self.crate = crate
        # cargo through /usr/bin/time, which appends each command's user and system CPU to a log in the
        # workspace (the sandbox hides this process's children's times): CPU is what a loaded machine cannot blur
        target = self.workspace / "target"
        target.mkdir(exist_ok=True)
        self.cpu_log = target / "bench-cpu.log"
        timed = work / "timed-cargo"
        timed.write_text(
            f"#!/bin/sh\nif [ -w {shlex.quote(str(target))} ]; then\n"
            f"  exec /usr/bin/time -a -o {shlex.quote(str(self.cpu_log))} -f '%U %S' "
            f'{shlex.quote(self.cargo.executable)} "$@"\nfi\nexec {shlex.quote(self.cargo.executable)} "$@"\n'
        )
        timed.chmod(0o755)
        self.cargo = Cargo(self.registry, self.runner, executable=str(timed))

    def cpu(self) -> float:
        """CPU seconds of every cargo command so far (each with its rustc, build scripts and tests)."""
        try:
            lines = self.cpu_log.read_text().split("\n")
        except FileNotFoundError:
            return 0.0
        pairs = [line.split() for line in lines]  # "user system"; time adds "Command exited with ..." lines
        return sum(float(u) + float(s) for u, s in (p for p in pairs if len(p) == 2) if _number(u) and _number(s))

    def cargo_run(
        self,
        *args: str,
        target: Path,
        env: dict[str, str] | None = None,
        nice: int = 0,
        on_line: Callable[[str, str], None] | None = None,
    ) -> Completed:
        done = self.cargo.run(
            *args,
            cwd=self.workspace,
            timeout=1800,
            env={"CARGO_TARGET_DIR": str(target), **(env or {})},
            nice=nice,
            on_line=on_line,
        )
        if done.returncode != 0:
            raise SystemExit(f"cargo {' '.join(args)} failed:\n{done.stderr[-3000:]}")
        return done

    def fresh(self, name: str) -> Path:
        self.round += 1
        target = self.workspace / "target" / f"{name}-{self.round}"
        shutil.rmtree(target, ignore_errors=True)
        return target


def _both(first: Callable[[], Completed], second: Callable[[], Completed]) -> list[Completed]:
    out: list[Completed] = []
    thread = threading.Thread(target=lambda: out.append(second()))
    thread.start()
    first_done = first()
    thread.join()
    return [first_done, *out]


def variants(b: Bench) -> dict[str, Callable[[], tuple[float, set[str] | None]]]:
    own = root_override(b.crate)

    #: how many dependency units the release build makes (counted in each bare build: ``shared-copy`` waits for them)
    dependency_units = [0]

    def bare() -> tuple[float, set[str] | None]:
        t = b.fresh("bare")
        start = time.perf_counter()
        done = b.cargo_run(*BUILD_FLAGS, target=t)
        took = time.perf_counter() - start
        dependency_units[0] = sum(1 for a in artifacts(done.stdout) if not str(a["package_id"]).startswith("path+"))
        return took, None

    def shared_copy() -> tuple[float, set[str] | None]:
        t = b.fresh("sharedcopy")
        tests_dir = t.parent / f"{t.name}-tests"
        own_names = {b.crate, b.crate.replace("-", "_")}
        ready = threading.Event()
        seen = [0]

        def on_line(stream: str, line: str) -> None:
            if stream == "stdout" and '"reason":"compiler-artifact"' in line and '"package_id":"path+' not in line:
                seen[0] += 1
                if seen[0] >= dependency_units[0]:
                    ready.set()

        def release() -> Completed:
            try:
                return b.cargo_run(*BUILD_FLAGS, target=t, on_line=on_line)
            finally:
                ready.set()

        def skip(_: str, names: list[str]) -> set[str]:  # the crate's own units, half written: not copied
            return {n for n in names if n == "incremental" or any(o in n for o in own_names)}

        def tests() -> Completed:
            ready.wait()
            try:
                shutil.copytree(t, tests_dir, symlinks=True, ignore=skip)
            except shutil.Error:
                pass  # a file the running release build replaced meanwhile: cargo compiles what is missing
            return b.cargo_run(*TEST, "--release", *own, *dev_only_opt0(b), target=tests_dir, nice=10)

        start = time.perf_counter()
        built, tested = _both(release, tests)
        took = time.perf_counter() - start
        print(f"    shared-copy: test step {compiled_units(tested.stdout, built.stdout)}", file=sys.stderr, flush=True)
        return took, test_names(tested.stdout)

    def release_after() -> tuple[float, set[str] | None]:
        t = b.fresh("after")
        start = time.perf_counter()
        b.cargo_run(*BUILD_FLAGS, target=t)
        tested = b.cargo_run(*TEST, "--release", target=t)
        return time.perf_counter() - start, test_names(tested.stdout)

    def dev_as_release() -> tuple[float, set[str] | None]:
        t = b.fresh("devrel")
        start = time.perf_counter()
        _, tested = _both(
            lambda: b.cargo_run(*BUILD_FLAGS, target=t),
            lambda: b.cargo_run(*TEST, target=t, env=DEV_AS_RELEASE),
        )
        return time.perf_counter() - start, test_names(tested.stdout)

    def shared_after() -> tuple[float, set[str] | None]:
        t = b.fresh("shared")
        start = time.perf_counter()
        b.cargo_run(*BUILD_FLAGS, target=t)
        tested = b.cargo_run(*TEST, "--release", *own, target=t)
        b.cargo_run(*BUILD_FLAGS, target=t)  # nothing to compile: puts the release binary back in place
        return time.perf_counter() - start, test_names(tested.stdout)

    def shared_first() -> tuple[float, set[str] | None]:
        t = b.fresh("sharedfirst")
        start = time.perf_counter()
        tested = b.cargo_run(*TEST, "--release", *own, target=t)
        b.cargo_run(*BUILD_FLAGS, target=t)
        return time.perf_counter() - start, test_names(tested.stdout)

    def shared_all_targets() -> tuple[float, set[str] | None]:
        t = b.fresh("sharedall")
        start = time.perf_counter()
        b.cargo_run(*TEST, "--release", *own, "--no-run", target=t)
        _, tested = _both(
            lambda: b.cargo_run(*BUILD_FLAGS, target=t / ".." / f"{t.name}-bin"),
            lambda: b.cargo_run(*TEST, "--release", *own, target=t),
        )
        return time.perf_counter() - start, test_names(tested.stdout)

    def shared() -> tuple[float, set[str] | None]:
        t = b.fresh("sharedseq")
        seal = t.parent / f"{t.name}-sealed"
        start = time.perf_counter()
        built = b.cargo_run(*BUILD_FLAGS, target=t)
        _, executables, _ = parse_cargo_messages(built.stdout.splitlines(), target_dir=t)
        seal.mkdir(parents=True, exist_ok=True)
        for name, path in executables.items():  # sealed before any test code runs
            shutil.copy2(path, seal / name)
        tested = b.cargo_run(*TEST, "--release", *own, *dev_only_opt0(b), target=t)
        took = time.perf_counter() - start
        print(f"    shared: test step {compiled_units(tested.stdout, built.stdout)}", file=sys.stderr, flush=True)
        return took, test_names(tested.stdout)

    def split_with(
        label: str, env: dict[str, str], more: tuple[str, ...] = (), nice: int = 10
    ) -> Callable[[], tuple[float, set[str] | None]]:
        """The release build beside a debug ``cargo test`` in its own target dir, with ``env`` and ``more``
        arguments for the tests' cargo, at ``nice``."""

        def run() -> tuple[float, set[str] | None]:
            t = b.fresh(label)
            start = time.perf_counter()
            _, tested = _both(
                lambda: b.cargo_run(*BUILD_FLAGS, target=t),
                lambda: b.cargo_run(*TEST, *more, target=t / "flakebot-test", env={**TEST_ENV, **env}, nice=nice),
            )
            return time.perf_counter() - start, test_names(tested.stdout)

        return run

    def one_release(dev_opt0: bool) -> Callable[[], tuple[float, set[str] | None]]:
        def run() -> tuple[float, set[str] | None]:
            t = b.fresh("onerel0" if dev_opt0 else "onerel")
            start = time.perf_counter()
            more = dev_only_opt0(b) if dev_opt0 else ()
            b.cargo_run(*BUILD_FLAGS, "--lib", "--bins", "--tests", "--examples", *more, target=t)
            tested = b.cargo_run(*TEST, "--release", *more, target=t)
            return time.perf_counter() - start, test_names(tested.stdout)

        return run

    return {
        "bare": bare,
        "shipped": split_with("shipped", COLD_TEST_ENV),
        **{f"knob-{k}": split_with(f"knob-{k}", NOINC | env, more) for k, (env, more) in KNOBS.items()},
        "split-noinc": split_with("splitnoinc", NOINC),
        "split-noinc-nice0": split_with("splitnoinc0", NOINC, nice=0),
        "split-noinc-j1": split_with("splitnoincj1", NOINC, ("-j1",), nice=0),
        "one-release": one_release(False),
        "one-release-dev0": one_release(True),
        "split": split_with("split", {}),
        "shared": shared,
        "shared-copy": shared_copy,
        "shared-deps-build-first": shared_after,
        "shared-deps-tests-first": shared_first,
        "release-tests": release_after,
        "dev-as-release": dev_as_release,
        "shared-no-run-then-both": shared_all_targets,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--registry", default=str(DEBIAN_REGISTRY))
    parser.add_argument("--crate", default="pulldown-cmark")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", nargs="*", help="variant names (default: all)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fb-bench-proof-"))
    try:
        b = Bench(args.registry, args.crate, work)
        # the crate's own `cargo test` (debug, as a user runs it): the test set every variant must match
        own = b.cargo_run(*TEST, target=b.fresh("own"))
        expected = test_names(own.stdout)
        chosen = {k: v for k, v in variants(b).items() if not args.only or k in args.only or k == "bare"}
        times: dict[str, list[float]] = {k: [] for k in chosen}
        names: dict[str, set[str] | None] = {}
        cpu: dict[str, list[float]] = {k: [] for k in chosen}
        for _ in range(args.rounds):
            for key, run in chosen.items():
                before = b.cpu()
                took, ran = run()
                cpu[key].append(b.cpu() - before)
                times[key].append(took)
                names[key] = ran
                print(f"  {key}: {took:.2f} s, {cpu[key][-1]:.1f} s of CPU", file=sys.stderr, flush=True)
        floor = min(times["bare"])
        print(f"\n{args.crate}: the crate's own `cargo test` runs {len(expected)} tests\n")
        cpu_floor = statistics.median(cpu["bare"])
        print(
            "| variant | best (s) | median (s) | / bare build (best) | median of per-round ratios | CPU (s, median) "
            "| CPU / bare | tests run | same tests as `cargo test` |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for key, seen in times.items():
            ran = names[key]
            same = "-" if ran is None else ("yes" if ran == expected else f"NO ({len(expected - ran)} missing)")
            print(
                f"| {key} | {min(seen):.2f} | {statistics.median(seen):.2f} | {min(seen) / floor:.2f}x | "
                f"{statistics.median(a / b for a, b in zip(seen, times['bare'], strict=True)):.2f}x | "
                f"{statistics.median(cpu[key]):.1f} | {statistics.median(cpu[key]) / cpu_floor:.2f}x | "
                f"{'-' if ran is None else len(ran)} | {same} |"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
