"""The dependency cache (issue 39), each number beside its floor in the same run.

    make bench BENCH_ARGS=--only-deps          # the rows below
    .venv/bin/python benchmarks/bench_depcache.py --compare   # the cache against sccache and build.build-dir

Rows:

* the first tool ever (pulldown-cmark, a fresh cache dir) and a second tool sharing dependencies with the
  first (hexyl after pulldown-cmark; markdown after cargo-binutils, which share regex's graph): the cold build
  with its proof through the pipeline / a bare cold ``cargo build --release`` of the same tree, measured
  right after it. The registry's search index is built outside the clock (branch i37 makes it one per
  machine); the same rows with the nix backend (a fresh copy of the nixpkgs stand-in each round, so nothing
  comes from /nix/store but what the run itself built);
* the unit store after 10 tools: units, bytes copied out and on disk, what ``clean`` keeps and frees, how long
  ``doctor``'s check of every unit by hash takes;
* a warm ``flakebot build`` of a tool built for that name and request: p50 wall time and peak resident memory.

``--compare``: the second tool of a pair (its release build and its test build, cold target dirs) after the
first, with nothing shared, with a shared ``build.build-dir`` (stable since cargo 1.91), with sccache (a fresh
cache warmed by the first), and with flakebot's unit cache (the stub builds of the first, then the second's
copied units): wall and CPU time of the second alone.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flakebot_magic.config import DEBIAN_REGISTRY, Settings  # noqa: E402
from flakebot_magic.events import EventBus, LogLine  # noqa: E402
from flakebot_magic.host.process import ProcessRunner  # noqa: E402
from flakebot_magic.manage.cleanup import clean  # noqa: E402
from flakebot_magic.manage.doctor import doctor  # noqa: E402
from flakebot_magic.pipeline import Pipeline  # noqa: E402
from flakebot_magic.records.units import UnitStore  # noqa: E402
from flakebot_magic.registry.directory import DirectoryRegistry  # noqa: E402
from flakebot_magic.sandbox import Sandbox  # noqa: E402
from flakebot_magic.sandbox.cargo import Cargo, find_cargo  # noqa: E402
from flakebot_magic.stages.build import BUILD_FLAGS, CAP_LINTS, COLD_TEST_ENV, TEST_ENV  # noqa: E402
from flakebot_magic.stages.deps import DependencyCache, DepsBuild, cache_mode, wait_for_fills  # noqa: E402

#: (first, second): the second shares dependencies with the first
PAIRS = (("pulldown-cmark", "hexyl"), ("cargo-binutils", "markdown"))
#: ten tools built into one cache for the store's size
TEN = (
    "pulldown-cmark",
    "hexyl",
    "markdown",
    "sanitize-filename",
    "difference",
    "lscolors",
    "xml-rs",
    "rustdoc-stripper",
    "semver-parser",
    "prettytable-rs",
)
FLAKEBOT = str(Path(sys.executable).parent / "flakebot")
_USED = re.compile(r"dependency cache: (\d+) units copied(?:, (\d+) compiled just now)?")


def _timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _name(crate: str) -> str:
    return crate.replace("-", "_")


def _cargo_argv(registry: str, *args: str) -> list[str]:
    """Plain cargo on the registry, lints capped at warn as flakebot's builds (a published ``deny(warnings)``
    meets today's lints: cargo-binutils)."""
    return [
        find_cargo(),
        *args,
        *CAP_LINTS,
        "--offline",
        "--config",
        'source.crates-io.replace-with="offline"',
        "--config",
        f'source.offline.directory="{registry}"',
    ]


def _export(workspace: Path, dest: Path) -> Path:
    """The workspace's HEAD as a fresh tree (what a bare build compiles)."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=workspace, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def bare_release(workspace: Path, registry: str, scratch: Path) -> float:
    """A plain cold ``cargo build --release`` of the workspace's HEAD in a fresh directory: its wall seconds."""
    tree = _export(workspace, scratch / f"bare-{workspace.name}-{time.monotonic_ns()}")
    argv = _cargo_argv(registry, "build", "--release")
    return _timed(lambda: subprocess.run(argv, cwd=tree, check=True, capture_output=True))


class _Used:
    """An observer of a build's log lines: what the dependency cache did (units copied and compiled in a stub, or
    deferred: the build compiled them itself and the stub seals them after)."""

    def __init__(self) -> None:
        self.found = {"copied": 0, "compiled": 0, "deferred": 0}

    def __call__(self, event: object) -> None:
        if isinstance(event, LogLine) and "dependency cache:" in event.line:
            match = _USED.search(event.line)
            if match:
                self.found["copied"] += int(match.group(1))
                self.found["compiled"] += int(match.group(2) or 0)
            elif "seals them for later tools" in event.line:
                self.found["deferred"] += 1


def _build(settings: Settings, crate: str) -> tuple[float, dict[str, int], float]:
    """Build ``crate`` (a cold build with its proof): wall seconds, what the cache did, and how long the stub
    builds it left for later then took (outside the clock)."""
    used = _Used()
    took = _timed(lambda: Pipeline(settings, observers=[used]).run("", crate=crate, name=_name(crate)))
    fill = _timed(lambda: wait_for_fills(3600))
    return took, used.found, fill


def shared_deps(
    registry: str, pairs: tuple[tuple[str, str], ...] = PAIRS, *, backend: str = "cargo", stand_in: Any = None
) -> dict[str, Any]:
    """Each pair in a fresh cache dir: the first tool, then the second; each beside a bare cold release build."""
    found: dict[str, Any] = {}
    for first, second in pairs:
        cache = Path(tempfile.mkdtemp(prefix=f"fb-bench-deps-{backend}-"))
        try:
            nixpkgs = stand_in(cache) if stand_in is not None else None
            settings = Settings(cache_dir=cache, registry=registry, backend=backend, nixpkgs=nixpkgs)
            DirectoryRegistry(registry, cache).search("warm up")  # the index, outside the clock (i37: per machine)
            row: dict[str, Any] = {"load": os.getloadavg()}
            for role, crate in (("first", first), ("second", second)):
                took, used, fill = _build(settings, crate)
                bare = bare_release(settings.cache.workspaces / _name(crate), registry, cache)
                row[role] = {"crate": crate, "pipeline_s": took, "bare_s": bare, "ratio": took / bare}
                row[role] |= {"units": used, "fill_s": fill}
            found[f"{first}->{second}"] = row
            for root in settings.cache.gcroots.glob("*"):
                if root.is_symlink():  # let nix-collect-garbage have the benchmark's builds
                    root.unlink()
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    return found


def store_after_ten(registry: str, crates: tuple[str, ...] = TEN) -> dict[str, Any]:
    """Ten tools into one cache (cargo backend): the unit store's size, what clean keeps and frees, doctor's check."""
    cache = Path(tempfile.mkdtemp(prefix="fb-bench-ten-"))
    try:
        settings = Settings(cache_dir=cache, registry=registry, backend="cargo")
        DirectoryRegistry(registry, cache).search("warm up")
        built, failed = [], {}
        used = {}
        for crate in crates:
            try:
                used[crate] = _build(settings, crate)[1]
                built.append(crate)
            except Exception as exc:  # a crate that does not build here is named, not fatal
                failed[crate] = str(exc).splitlines()[0][:200]
                wait_for_fills(3600)
        units, copied, on_disk = UnitStore(settings.cache.units).usage()
        store_bytes = int(
            subprocess.run(["du", "-sb", str(settings.cache.store)], capture_output=True, text=True).stdout.split()[0]
        )
        started = time.perf_counter()
        report = doctor(settings)
        doctor_s = time.perf_counter() - started
        cleaned = clean(settings)
        after = UnitStore(settings.cache.units).usage()
        return {
            "built": built,
            "failed": failed,
            "used": used,
            "units": units,
            "copied_bytes": copied,
            "on_disk_bytes": on_disk,
            "tool_store_bytes": store_bytes,
            "doctor_s": doctor_s,
            "doctor_set_aside": [line for line in report.set_aside if "dependency unit" in line],
            "clean_units_line": cleaned.units,
            "clean_freed_bytes": cleaned.freed,
            "units_after_clean": after[0],
        }
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def warm_memory(registry: str, runs: int = 7) -> dict[str, float]:
    """A warm ``flakebot build`` (a fresh process) of a tool built for that name and request: p50 wall, peak RSS."""
    cache = Path(tempfile.mkdtemp(prefix="fb-bench-warm-rss-"))
    request = "Render Markdown text to HTML."
    try:
        Pipeline(Settings(cache_dir=cache, registry=registry, backend="cargo")).run(request, name="md")
        wait_for_fills(3600)  # its dependencies sealed after it: not what a warm re-run measures
        env = {
            **os.environ,
            "FLAKEBOT_CACHE_DIR": str(cache),
            "FLAKEBOT_REGISTRY": registry,
            "FLAKEBOT_BACKEND": "cargo",
        }
        walls, peaks = [], []
        for _ in range(runs):
            argv = ["/usr/bin/time", "-f", "%M", FLAKEBOT, "build", request, "--name", "md", "--quiet", "--json"]
            started = time.perf_counter()
            done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
            walls.append(time.perf_counter() - started)
            peaks.append(int(done.stderr.strip().splitlines()[-1]) * 1024)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return {"command_p50_s": statistics.median(walls), "peak_rss_p50_bytes": statistics.median(peaks)}


# -- the mechanisms compared on the same work ---------------------------------------------------------------


def _children_cpu() -> float:
    """CPU seconds the whole machine has spent (/proc/stat: user, nice, system): a sandboxed build's processes
    and sccache's server are no children of this process, so their time is counted this way (exact on a quiet
    machine; other people's work counts too under load, which the row notes)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:4]
    return sum(int(f) for f in fields) / os.sysconf("SC_CLK_TCK")


def _both_builds(tree: Path, registry: str, env: dict[str, str], target: Path) -> tuple[float, float]:
    """The tree's release build and its test build (``--no-run``), each in its own cold target dir: wall, CPU."""
    cpu, started = _children_cpu(), time.perf_counter()
    for sub, args in (("release", ("build", "--release")), ("test", ("test", "--no-run"))):
        # --target-dir, not CARGO_TARGET_DIR: sccache hashes the CARGO_* variables rustc sees, and would miss
        argv = _cargo_argv(registry, *args, "--target-dir", str(target / sub))
        done = subprocess.run(argv, cwd=tree, env={**os.environ, **env}, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"cargo {' '.join(args)} in {tree} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - started, _children_cpu() - cpu


def compare(registry: str, pair: tuple[str, str] = PAIRS[0]) -> dict[str, Any]:
    """The second tool of ``pair`` after the first, four ways: nothing shared, build.build-dir, sccache, units."""
    scratch = Path(tempfile.mkdtemp(prefix="fb-bench-compare-"))
    try:
        settings = Settings(cache_dir=scratch / "cache", registry=registry, backend="cargo", keep_workspace=True)
        DirectoryRegistry(registry, settings.cache_dir).search("warm up")
        trees = {}
        for crate in pair:  # flakebot's forks: the workspaces (Cargo.lock resolved against the registry)
            Pipeline(Settings(cache_dir=scratch / "forks", registry=registry, backend="cargo")).run(
                "", crate=crate, name=_name(crate)
            )
            trees[crate] = _export(scratch / "forks" / "workspaces" / _name(crate), scratch / "trees" / crate)
        first, second = (trees[c] for c in pair)
        found: dict[str, Any] = {"pair": list(pair), "load_before": os.getloadavg()}
        found["nothing shared"] = _both_builds(second, registry, {}, scratch / "t-cold")
        shared = {"CARGO_BUILD_BUILD_DIR": str(scratch / "build-dir")}
        _both_builds(first, registry, shared, scratch / "t-bd-first")
        found["build.build-dir"] = _both_builds(second, registry, shared, scratch / "t-bd-second")
        if shutil.which("sccache"):
            cached = {"RUSTC_WRAPPER": "sccache", "SCCACHE_DIR": str(scratch / "sccache")}
            subprocess.run(["sccache", "--stop-server"], capture_output=True, env={**os.environ, **cached})
            _both_builds(first, registry, cached, scratch / "t-sc-first")
            found["sccache"] = _both_builds(second, registry, cached, scratch / "t-sc-second")
            stats = subprocess.run(
                ["sccache", "--show-stats"], capture_output=True, text=True, env={**os.environ, **cached}
            )
            found["sccache_stats"] = stats.stdout
            subprocess.run(["sccache", "--stop-server"], capture_output=True, env={**os.environ, **cached})
        found["units"] = _with_units(first, second, registry, settings)
        found["load_after"] = os.getloadavg()
        return found
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _with_units(first: Path, second: Path, registry: str, settings: Settings) -> tuple[float, float]:
    """flakebot's cache: the first's units sealed by its stub builds, then the second's: its stub builds (the
    units it lacks), the copies, and its two builds in cold target dirs (in flakebot's sandbox)."""
    runner = ProcessRunner()
    base = Cargo(DirectoryRegistry(registry, settings.cache_dir), runner)
    cache = DependencyCache(
        UnitStore(settings.cache.units),
        registry=Path(registry),
        toolchain=base.rustc_version(),
        mode=cache_mode(),
        bus=EventBus(),
    )
    builds = (
        DepsBuild("release", "release", BUILD_FLAGS),
        DepsBuild(
            "test",
            "debug",
            ("test", "--locked", "--message-format=json", "--no-fail-fast", *CAP_LINTS, "--no-run"),
            TEST_ENV | COLD_TEST_ENV,
        ),
    )
    for tree in (first, second):
        cargo = base.confined_to(Sandbox(tree))
        plan = cache.plan(tree)
        assert not isinstance(plan, str), plan
        cpu, started = _children_cpu(), time.perf_counter()
        for build in builds:
            target = tree / "target" / build.name
            target.mkdir(parents=True)
            done = cache.provide(plan, build, tree, f"target/{build.name}", cargo, timeout=3600)
            assert not done.why_not, done.why_not
            ran = cargo.run(*build.args, cwd=tree, timeout=3600, env={**build.env, "CARGO_TARGET_DIR": str(target)})
            assert ran.returncode == 0, ran.stderr[-2000:]
        took = (time.perf_counter() - started, _children_cpu() - cpu)
    return took


def rows(found: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The table rows of :func:`shared_deps` (both backends), :func:`store_after_ten` and :func:`warm_memory`."""
    out: list[tuple[str, str, str]] = []
    for backend in ("deps_cargo", "deps_nix"):
        for pair, row in found.get(backend, {}).items():
            where = "" if backend == "deps_cargo" else ", nix backend"
            load = " to ".join(f"{x:.0f}" for x in row["load"][:2])
            first, second = row["first"], row["second"]
            units = second["units"]
            how = f"units copied {units['copied']}, compiled in a stub {units['compiled']}"
            if units["deferred"]:
                how += f", {units['deferred']} of its 2 builds compiling their own"
            out.append((
                f"second tool, {second['crate']} after {first['crate']}{where}: cold build with proof / bare cold "
                f"`cargo build --release` ({how}; the first's units sealed after it in {first['fill_s']:.0f} s, "
                f"outside the clock; load {load})",
                f"{second['pipeline_s']:.1f} s / {second['bare_s']:.1f} s = **{second['ratio']:.2f}x**",
                "<= 1.0x",
            ))  # fmt: skip
            if pair.startswith("pulldown-cmark"):
                out.append((
                    f"first tool ever, {first['crate']}{where}: cold build with proof / bare cold `cargo build "
                    f"--release` (the index built outside the clock; its dependencies sealed after it, in "
                    f"{first['fill_s']:.0f} s)",
                    f"{first['pipeline_s']:.1f} s / {first['bare_s']:.1f} s = **{first['ratio']:.2f}x**",
                    "<= 2.3x",
                ))  # fmt: skip
    if "deps_ten" in found:
        ten = found["deps_ten"]
        out.append((
            f"the unit store after {len(ten['built'])} tools: units, bytes (copied out / on disk); beside them the "
            "tools' own store",
            f"{ten['units']} units, {ten['copied_bytes'] / 2**20:.0f} MiB / **{ten['on_disk_bytes'] / 2**20:.0f} MiB**; "
            f"tools {ten['tool_store_bytes'] / 2**20:.0f} MiB",
            "-",
        ))  # fmt: skip
        out.append((
            "`doctor` checking every unit by hash; `clean` (keeps the units, frees what no record names)",
            f"{ten['doctor_s']:.1f} s, {len(ten['doctor_set_aside'])} set aside; kept {ten['units_after_clean']} "
            f"units, freed {ten['clean_freed_bytes'] / 2**20:.0f} MiB",
            "-",
        ))  # fmt: skip
    if "deps_warm" in found:
        warm = found["deps_warm"]
        out.append((
            "warm `flakebot build` of a tool built for that name and request (p50 wall; peak resident memory)",
            f"**{warm['command_p50_s']:.3f} s**; **{warm['peak_rss_p50_bytes'] / 2**20:.0f} MB**",
            "<= 0.5 s, < 150 MB",
        ))  # fmt: skip
    return out


def measure(registry: str, *, nix_stand_in: Any = None) -> dict[str, Any]:
    """Every row of this module, in one run (``make bench BENCH_ARGS=--only-deps``)."""
    found: dict[str, Any] = {"deps_warm": warm_memory(registry), "deps_cargo": shared_deps(registry)}
    if nix_stand_in is not None and shutil.which("nix"):
        found["deps_nix"] = shared_deps(registry, backend="nix", stand_in=nix_stand_in)
    found["deps_ten"] = store_after_ten(registry)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--registry", default=str(DEBIAN_REGISTRY))
    parser.add_argument("--compare", action="store_true", help="the cache against sccache and build.build-dir")
    parser.add_argument("--pair", nargs=2, default=list(PAIRS[0]), metavar=("FIRST", "SECOND"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    found = compare(args.registry, tuple(args.pair)) if args.compare else measure(args.registry)
    print(json.dumps(found, indent=2, default=str))
    if args.json:
        args.json.write_text(json.dumps(found, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
