"""flakebot benchmarks: each number measured beside its floor, in one run.

    make bench                     # print the table
    make bench BENCH_ARGS=--readme # also rewrite the table in README.md

What is measured (targets from the issues):

* cold pipeline for pulldown-cmark (search, fork, cargo build --release and
  cargo test, flake, deploy) vs a plain ``cargo build --release`` of the same
  source in a fresh directory: ratio, target <= 1.15;
* warm re-run of the same request (a cache hit): wall time of the
  ``flakebot build`` command and of ``flakebot_magic.build()`` in-process,
  target <= 0.5 s;
* ``flakebot`` search over the whole installed registry, warm index: p50,
  target <= 30 ms;
* ``python -c "import flakebot_magic"``: target <= 150 ms, and openai,
  ipywidgets, tornado and IPython not imported.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flakebot_magic.cargo import find_cargo  # noqa: E402
from flakebot_magic.config import DEBIAN_REGISTRY, Settings  # noqa: E402
from flakebot_magic.pipeline import Pipeline  # noqa: E402
from flakebot_magic.registry.directory import DirectoryRegistry  # noqa: E402
from flakebot_magic.stages import search as search_stage  # noqa: E402

REQUEST = "Render Markdown text to HTML."
FLAKEBOT = str(Path(sys.executable).parent / "flakebot")


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def cold_vs_cargo(registry: str, rounds: int) -> dict[str, float]:
    """Alternate a cold pipeline and a plain cargo build of the same tree."""
    pipeline_times: list[float] = []
    cargo_times: list[float] = []
    for _ in range(rounds):
        cache = Path(tempfile.mkdtemp(prefix="fb-bench-cold-"))
        try:
            settings = Settings(cache_dir=cache, registry=registry)
            # the index is a per-registry cache, not part of a request: build it first
            DirectoryRegistry(registry, cache).search("warm up")
            pipeline_times.append(timed(lambda: Pipeline(settings).run(REQUEST, name="md")))
            plain = cache / "plain"
            workspace = cache / "workspaces" / "md"
            plain.mkdir()
            archive = subprocess.run(["git", "archive", "HEAD"], cwd=workspace, capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(plain)], input=archive, check=True)
            cargo = [
                find_cargo(), "build", "--release", "--offline",
                "--config", 'source.crates-io.replace-with="offline"',
                "--config", f'source.offline.directory="{registry}"',
            ]
            cargo_times.append(
                timed(lambda: subprocess.run(cargo, cwd=plain, check=True, capture_output=True))
            )
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    best_pipeline, best_cargo = min(pipeline_times), min(cargo_times)
    return {"pipeline_s": best_pipeline, "cargo_s": best_cargo, "ratio": best_pipeline / best_cargo}


def warm(registry: str, runs: int) -> dict[str, float]:
    cache = Path(tempfile.mkdtemp(prefix="fb-bench-warm-"))
    try:
        settings = Settings(cache_dir=cache, registry=registry)
        Pipeline(settings).run(REQUEST, name="md")
        in_process = [timed(lambda: Pipeline(settings).run(REQUEST, name="md")) for _ in range(runs)]
        env = {**os.environ, "FLAKEBOT_CACHE_DIR": str(cache), "FLAKEBOT_REGISTRY": registry}
        command = [FLAKEBOT, "build", REQUEST, "--name", "md", "--quiet", "--json"]
        wall = [
            timed(lambda: subprocess.run(command, env=env, check=True, capture_output=True))
            for _ in range(runs)
        ]
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return {"command_p50_s": statistics.median(wall), "in_process_p50_s": statistics.median(in_process)}


def search_p50(registry: str, runs: int) -> dict[str, float]:
    cache = Path(tempfile.mkdtemp(prefix="fb-bench-search-"))
    queries = ["render markdown to html", "hex viewer", "sha256 hash", "base64 encode", "parse json",
               "regular expressions", "compress gzip", "command line arguments", "date and time", "http server"]
    try:
        built = timed(lambda: DirectoryRegistry(registry, cache).search("warm"))
        found = DirectoryRegistry(registry, cache)
        crates = found._connect().execute("SELECT count(*) FROM crates").fetchone()[0]
        times = []
        for i in range(runs):
            query = queries[i % len(queries)]
            times.append(timed(lambda: search_stage.search(found, query, limit=10)))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return {"p50_ms": statistics.median(times) * 1000, "p95_ms": sorted(times)[int(runs * 0.95) - 1] * 1000,
            "crates": crates, "index_build_s": built}


def import_time(runs: int) -> dict[str, object]:
    probe = "import sys, flakebot_magic; print(','.join(m for m in ('openai','ipywidgets','tornado','IPython','httpx') if m in sys.modules))"
    times, loaded = [], ""
    baseline = []
    for _ in range(runs):
        times.append(timed(lambda: subprocess.run([sys.executable, "-c", "import flakebot_magic"], check=True)))
        baseline.append(timed(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True)))
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    return {"p50_ms": statistics.median(times) * 1000, "python_alone_ms": statistics.median(baseline) * 1000,
            "heavy_modules": loaded or "none"}


def table(results: dict[str, dict[str, object]]) -> str:
    cold, warm_, search, imp = results["cold"], results["warm"], results["search"], results["import"]
    rows = [
        ("cold pipeline (pulldown-cmark) / plain `cargo build --release`",
         f"{cold['pipeline_s']:.1f} s / {cold['cargo_s']:.1f} s = **{cold['ratio']:.2f}x**", "<= 1.15x"),
        ("warm re-run, `flakebot build` command (p50)", f"**{warm_['command_p50_s']:.3f} s**", "<= 0.5 s"),
        ("warm re-run, `flakebot_magic.build()` in-process (p50)", f"{warm_['in_process_p50_s'] * 1000:.0f} ms", "<= 0.5 s"),
        (f"search, warm index over {search['crates']} crates (p50 / p95)",
         f"**{search['p50_ms']:.2f} ms** / {search['p95_ms']:.2f} ms", "<= 30 ms"),
        ("index build, whole registry (once per registry change)", f"{search['index_build_s']:.2f} s", "-"),
        ("`python -c 'import flakebot_magic'` (p50; python alone)",
         f"**{imp['p50_ms']:.0f} ms** ({imp['python_alone_ms']:.0f} ms)", "<= 150 ms"),
        ("heavy modules imported by `import flakebot_magic`", str(imp["heavy_modules"]), "none"),
    ]
    lines = ["| measurement | result | target |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--registry", default=str(DEBIAN_REGISTRY))
    parser.add_argument("--cold-rounds", type=int, default=2)
    parser.add_argument("--readme", action="store_true", help="rewrite the benchmark table in README.md")
    parser.add_argument("--json", type=Path, help="also write the raw numbers here")
    args = parser.parse_args()
    if not (Path(args.registry) / "pulldown-cmark-0.9.2").is_dir():
        print("the offline registry is missing: run `make install` first", file=sys.stderr)
        return 1
    results: dict[str, dict[str, object]] = {}
    print("benchmark: import time ...", file=sys.stderr)
    results["import"] = import_time(9)
    print("benchmark: search ...", file=sys.stderr)
    results["search"] = search_p50(args.registry, 200)
    print("benchmark: warm re-run ...", file=sys.stderr)
    results["warm"] = warm(args.registry, 7)
    print(f"benchmark: cold pipeline vs cargo ({args.cold_rounds} rounds, a few minutes) ...", file=sys.stderr)
    results["cold"] = cold_vs_cargo(args.registry, args.cold_rounds)
    machine = f"{os.cpu_count()} cores, {subprocess.run(['rustc', '--version'], capture_output=True, text=True, env={**os.environ, 'PATH': os.path.dirname(find_cargo()) + os.pathsep + os.environ['PATH']}).stdout.strip()}, {time.strftime('%Y-%m-%d')}"
    text = table(results) + f"\n\nMeasured by `make bench` on {machine}."
    print(text)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    if args.readme:
        readme = ROOT / "README.md"
        content = readme.read_text()
        new = re.sub(r"(<!-- bench:start -->\n).*?(\n<!-- bench:end -->)", lambda m: m.group(1) + text + m.group(2), content, flags=re.S)
        readme.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
