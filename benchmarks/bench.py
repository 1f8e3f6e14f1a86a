"""flakebot benchmarks: each number measured beside its floor, in one run.

    make bench                       # print the table, and write it into docs/benchmarks.md
    make bench BENCH_ARGS=--no-docs  # print it only

docs/benchmarks.md keeps the latest run between ``<!-- bench:start -->`` and
``<!-- bench:end -->``: a row is replaced by the row of the same measurement
(its first cell), a new one added, and the rows a partial run (``--only-...``)
did not measure stay as they were (:func:`merge_rows`).

What is measured (targets from the issues):

* cold pipeline for pulldown-cmark (search, fork, cargo build --release and
  cargo test, flake, deploy) vs a plain ``cargo build --release`` of the same
  source in a fresh directory: ratio, target <= 1.15; the same for hexyl
  (``--crate``-style: built by name, issue 23);
* warm re-run of the same request (a cache hit): wall time of the
  ``flakebot build`` command and of ``flakebot_magic.build()`` in-process,
  target <= 0.5 s;
* ``flakebot`` search over the whole installed registry, warm index: p50,
  target <= 10 ms;
* search accuracy (issue 10): top-1 and top-3 accuracy over the requests of
  ``tests/search_requests.toml``, the tuning half and the held-out half
  reported apart, and the p50/p95 latency of those requests
  (``make bench BENCH_ARGS=--only-search`` measures only this, the row
  above and the two below);
* search and fitness on paraphrases (issue 20): top-1/3/10 and the fitness
  decision without a model (right deploy / honest NeedsModelError naming an
  accepted crate in its first five / a refusal that does not / wrong deploy)
  over ``tests/search_paraphrases.toml``, tuning and held-out halves apart,
  targets on the held-out half top-3 >= 0.95, top-10 >= 0.99, 0 wrong deploys;
  with semantic search (the embedding model) and with words only, each
  query's latency once; the index build with embeddings and without, and the
  first search of a fresh process (the model loaded), each in a fresh process;
  the same metrics on the blind sets ``tests/search_paraphrases_fresh.toml``,
  ``..._blind2.toml``, ``..._blind3.toml`` and ``..._blind4.toml`` (written by
  someone who never saw the code, added after all tuning), all of it and by its
  requests' half;
* issue 20's five requests through the real pipeline (cargo, cold cache):
  the right tool deployed and called, or NeedsModelError naming the library
  (``--no-issue-requests`` skips these few minutes);
* the edit loop (scripted: the fake OpenAI server replays the sha2 session
  of ``flakebot_magic/testing/scripts/sha256.json`` plus edit-only iterations, real cargo in
  the sandbox): flakebot's own time per check run on top of cargo's, target
  <= 5% of the cargo time (issue 23), and the dependency units cargo compiles after the
  baseline check run (count ``compiler-artifact`` messages with
  ``fresh: false`` for non-workspace packages), target 0;
* speculative candidates (issue 13, ``benchmarks/bench_candidates.py``): the
  edit session on sha2 with 3 candidates vs the same session with 1, each
  reply after 1.5 s of simulated model latency, target ratio <= 1.5; and the
  dependency units each extra candidate's first check run compiles, target 0
  (``make bench BENCH_ARGS=--only-candidates`` measures only these);
* the starter suite proven (issues 25, 35, ``benchmarks/bench_eval.py``):
  ``flakebot eval starter --reference`` with 2 jobs, every task must pass
  its hidden tests; wall time, and the p50 and slowest task
  (``make bench BENCH_ARGS=--only-eval`` measures only this);
* ``python -c "import flakebot_magic"``: target <= 150 ms, and openai,
  ipywidgets, tornado and IPython not imported;
* nix backend (when nix is installed): the cold pipeline with ``nix build``
  vs the cold cargo-backend pipeline for the same crate, alternated, target
  ratio <= 1.3 (each nix round builds against a fresh copy of the nixpkgs
  stand-in whose builder differs by a comment, so nothing comes from
  /nix/store); and the warm re-run (cache hit) with the nix backend, target
  <= 0.5 s.

* a team (issue 24, ``benchmarks/bench_team.py``, with nix): a teammate's
  first call of a tool pulled from a signed ``file://`` cache into an empty
  second nix store (narHash and signature checked, proof read) vs the cold
  nix build of the same tool, target <= 0.1x; and the push
  (``make bench BENCH_ARGS=--only-team`` measures only these);

* the sandbox's cost per cargo command (issue 19, ``benchmarks/bench_sandbox.py``):
  ``cargo --version``, ``cargo metadata --no-deps`` and a no-op ``cargo build``
  plain and wrapped, side by side, in the build profile and the fetch profile
  (and without the seccomp filter), p50; and ``Cargo.run`` end to end
  (``make bench BENCH_ARGS=--only-sandbox`` measures only these);

* the tool clients (issue 5), each against its floor in the same run: a
  CLI call (``md("# Hi")``) vs a raw ``subprocess.run`` of the same binary,
  p50 ratio, target <= 1.05 (issue 23); an MCP call round trip (``calc.add``, the
  fixture server kept running) p50, target <= 0.3 ms, vs spawning the server
  per call; an HTTP call with keep-alive (``svc.greet``, the fixture
  service) p50, target <= 1.05x a raw keep-alive ``httpx`` request to the same
  service (keep-alive, and a new connection each time).

* the dependency cache (issue 39, ``benchmarks/bench_depcache.py``): the first tool ever and a second tool
  sharing dependencies with the first, each beside a bare cold ``cargo build --release`` (both backends); the
  unit store after ten tools and what ``clean`` and ``doctor`` do with it; a warm ``flakebot build``'s wall
  time and peak memory (``make bench BENCH_ARGS=--only-deps`` measures only these);

* the same crate under a second name (issue 23): after each cold pipeline, the
  same request under another name with ``rebuild``: the release build runs
  again, ``cargo test`` must not (its proof is found); its time beside the
  plain cargo build (``make bench BENCH_ARGS=--only-cold`` measures only the
  cold rows).

The cargo rows use ``backend="cargo"`` explicitly (``auto`` would pick nix
wherever it is installed).
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

from bench_candidates import candidate_rows, candidates_bench  # noqa: E402
from bench_depcache import measure as deps_measure  # noqa: E402
from bench_depcache import rows as deps_rows  # noqa: E402
from bench_eval import eval_bench, eval_rows  # noqa: E402
from bench_sandbox import sandbox_bench, sandbox_rows  # noqa: E402
from bench_team import team_bench, team_rows  # noqa: E402

from flakebot_magic.config import DEBIAN_REGISTRY, Settings  # noqa: E402
from flakebot_magic.pipeline import Pipeline  # noqa: E402
from flakebot_magic.registry.directory import DirectoryRegistry  # noqa: E402
from flakebot_magic.request import BuildRequest, RunFlags  # noqa: E402
from flakebot_magic.sandbox.cargo import find_cargo  # noqa: E402
from flakebot_magic.stages import search as search_stage  # noqa: E402

REQUEST = "Render Markdown text to HTML."
FLAKEBOT = str(Path(sys.executable).parent / "flakebot")


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def cold_vs_cargo(registry: str, rounds: int, crate: str | None = None) -> dict[str, float]:
    """Alternate a cold pipeline and a plain cargo build of the same tree.

    The pipeline builds :data:`REQUEST` (pulldown-cmark), or ``crate`` by
    name (no search, no second name: issue 23's hexyl row).

    Each round also builds the same crate under a second name with
    ``rebuild`` (a new workspace, the release build again): the proof of the
    first is found (issue 23), so no ``cargo test`` runs; its time is the
    ``second_s`` row, and ``second_tests_run`` counts rounds where the test
    row was not ``cached`` (target 0).
    """
    from flakebot_magic.events import StageFinished

    pipeline_times: list[float] = []
    cargo_times: list[float] = []
    second_times: list[float] = []
    tests_run = 0
    for _ in range(rounds):
        cache = Path(tempfile.mkdtemp(prefix="fb-bench-cold-"))
        try:
            settings = Settings(cache_dir=cache, registry=registry, backend="cargo")
            # the index is a per-registry cache, not part of a request: build it first
            DirectoryRegistry(registry, cache).search("warm up")
            name = crate or "md"
            pipeline_times.append(
                timed(lambda: Pipeline(settings).run("" if crate else REQUEST, crate=crate, name=name))
            )
            plain = cache / "plain"
            workspace = cache / "workspaces" / name
            plain.mkdir()
            archive = subprocess.run(["git", "archive", "HEAD"], cwd=workspace, capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(plain)], input=archive, check=True)
            cargo = [
                find_cargo(),
                "build",
                "--release",
                "--offline",
                "--config",
                'source.crates-io.replace-with="offline"',
                "--config",
                f'source.offline.directory="{registry}"',
            ]
            cargo_times.append(timed(lambda: subprocess.run(cargo, cwd=plain, check=True, capture_output=True)))
            if crate:
                continue
            rows: list[StageFinished] = []
            again = Settings(cache_dir=cache, registry=registry, backend="cargo")
            observe = [lambda e: rows.append(e) if isinstance(e, StageFinished) else None]
            rebuild = BuildRequest(REQUEST, name="md2", flags=RunFlags(rebuild=True))
            second_times.append(timed(lambda: Pipeline(again, observers=observe).run(rebuild)))
            tests_run += any(r.stage == "test" and r.status != "cached" for r in rows)
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    best_pipeline, best_cargo = min(pipeline_times), min(cargo_times)
    found = {"pipeline_s": best_pipeline, "cargo_s": best_cargo, "ratio": best_pipeline / best_cargo}
    if second_times:
        found |= {
            "second_s": min(second_times),
            "second_ratio": min(second_times) / best_cargo,
            "second_tests_run": tests_run,
        }
    return found


def warm(registry: str, runs: int, backend: str = "cargo", nixpkgs: str | None = None) -> dict[str, float]:
    cache = Path(tempfile.mkdtemp(prefix=f"fb-bench-warm-{backend}-"))
    try:
        settings = Settings(cache_dir=cache, registry=registry, backend=backend, nixpkgs=nixpkgs)
        Pipeline(settings).run(REQUEST, name="md")
        in_process = [timed(lambda: Pipeline(settings).run(REQUEST, name="md")) for _ in range(runs)]
        env = {
            **os.environ,
            "FLAKEBOT_CACHE_DIR": str(cache),
            "FLAKEBOT_REGISTRY": registry,
            "FLAKEBOT_BACKEND": backend,
            **({"FLAKEBOT_NIXPKGS": nixpkgs} if nixpkgs else {}),
        }
        command = [FLAKEBOT, "build", REQUEST, "--name", "md", "--quiet", "--json"]
        wall = [timed(lambda: subprocess.run(command, env=env, check=True, capture_output=True)) for _ in range(runs)]
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return {"command_p50_s": statistics.median(wall), "in_process_p50_s": statistics.median(in_process)}


def edit_loop_overhead(registry: str, extra_iterations: int = 4) -> dict[str, float]:
    """One scripted edit session on sha2: flakebot's time per check run beside cargo's, and rebuilt dependencies.

    The session is the test script (a compile error, its fix) followed by
    ``extra_iterations`` edits of the binary, each with ``run_checks``. Per
    iteration, ``seconds - cargo_seconds`` is flakebot's own time: the
    ratchet's scan of the tests, parsing cargo's JSON, reading the contract,
    the git commit, the events, the report (the sandbox's wrappers are inside
    the cargo time; measured apart below).
    """
    from flakebot_magic.edit import EditLoop
    from flakebot_magic.edit.session import engineer_channel
    from flakebot_magic.events import EventBus
    from flakebot_magic.host.git import Git
    from flakebot_magic.host.process import ProcessRunner
    from flakebot_magic.llm.budget import Budget
    from flakebot_magic.llm.model import ModelConfig
    from flakebot_magic.sandbox import Sandbox
    from flakebot_magic.sandbox.cargo import Cargo
    from flakebot_magic.stages.fork import fork
    from flakebot_magic.testing.fake_openai import FakeOpenAIServer

    replies = json.loads((ROOT / "flakebot_magic" / "testing" / "scripts" / "sha256.json").read_text())["responses"]
    # the edit loop's replies (the script starts with the pipeline's crate choice, which the loop never asks for)
    script = [r for r in replies if r["tool_calls"][0]["function"]["name"] != "choose_crate"]
    fixed = json.loads(script[1]["tool_calls"][0]["function"]["arguments"])["content"]

    def checks(content: str, number: int) -> dict[str, object]:
        write = {
            "id": f"w{number}",
            "type": "function",
            "function": {
                "name": "write_file",
                "arguments": json.dumps({"path": "src/bin/sha256.rs", "content": content}),
            },
        }
        run = {"id": f"r{number}", "type": "function", "function": {"name": "run_checks", "arguments": "{}"}}
        return {"role": "assistant", "content": None, "tool_calls": [write, run]}

    edits = [checks(fixed, 0)] + [checks(fixed + f"\n// edit {i}\n", i) for i in range(1, extra_iterations + 1)]
    finish = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "f", "type": "function", "function": {"name": "finish", "arguments": '{"summary": "bench"}'}}
        ],
    }
    cache = Path(tempfile.mkdtemp(prefix="fb-bench-edit-"))
    try:
        found = DirectoryRegistry(registry, cache)
        runner = ProcessRunner()
        workspace = fork(
            found.get("sha2"),
            found,
            cache / "workspaces",
            "sha",
            runner=runner,
            bus=EventBus(),
            cargo=Cargo(found, runner),
        )
        sandbox = Sandbox(workspace.path)
        with FakeOpenAIServer([script[0], *edits, finish]) as server:
            model = ModelConfig.resolve("scripted", base_url=server.base_url)
            assert model is not None
            settings = Settings(cache_dir=cache, max_iterations=extra_iterations + 4)
            bus = EventBus()
            budget = Budget(settings.token_budget)
            channel = engineer_channel(model, bus=bus, budget=budget, limits=settings.reply_limits())
            loop = EditLoop(
                workspace.path,
                channel,
                limits=settings.loop_limits(),
                cargo=Cargo(found, runner, sandbox),
                bus=bus,
                git=Git(workspace.path, runner),
                crate=workspace.crate,
            )
            loop.run("a command that prints the SHA-256 of its standard input")
        runs = loop.runs
        later = [r for r in runs if r.iteration >= 1]
        ratios = [(r.seconds - r.cargo_seconds) / r.cargo_seconds for r in later]
        own_ms = [(r.seconds - r.cargo_seconds) * 1000 for r in later]
        wrapper = [
            timed(lambda: runner.run(sandbox.command(["true"]), env=sandbox.env(), timeout=30)) for _ in range(9)
        ]
        bare = [timed(lambda: runner.run(["true"], timeout=30)) for _ in range(9)]
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return {
        "check_runs": len(later),
        "cargo_p50_s": statistics.median(r.cargo_seconds for r in later),
        "own_p50_ms": statistics.median(own_ms),
        "own_max_ms": max(own_ms),
        "ratio_p50": statistics.median(ratios),
        "ratio_max": max(ratios),
        "baseline_dependency_units": runs[0].dependency_units,
        "dependency_units_after_baseline": sum(r.dependency_units for r in later),
        "sandbox_wrapper_ms": (statistics.median(wrapper) - statistics.median(bare)) * 1000,
        "isolated": sandbox.isolated,
    }


def _edit_rows(results: dict[str, dict[str, object]]) -> list[tuple[str, str, str]]:
    edit = results.get("edit")
    if not edit:
        return []
    cargo_ms = float(edit["cargo_p50_s"]) * 1000  # type: ignore[arg-type]
    return [
        (
            f"edit loop: flakebot's own time per check run on top of cargo's (p50 / max over {edit['check_runs']} runs)",
            f"**{edit['own_p50_ms']:.0f} ms / {cargo_ms:.0f} ms = {float(edit['ratio_p50']) * 100:.1f}%** "  # type: ignore[arg-type]
            f"(max {float(edit['ratio_max']) * 100:.1f}%)",
            "<= 5% (issue 23)",
        ),  # type: ignore[arg-type]
        (
            "edit loop: dependency units compiled after the baseline check run (baseline: "
            f"{edit['baseline_dependency_units']})",
            f"**{edit['dependency_units_after_baseline']}**",
            "0",
        ),
        (
            "edit loop: sandbox wrappers (bwrap + prlimit) per cargo command"
            + ("" if edit["isolated"] else " (no bwrap)"),
            f"{edit['sandbox_wrapper_ms']:.0f} ms",
            "-",
        ),
    ]


def _fresh_stand_in(root: Path) -> str:
    """A copy of the nixpkgs stand-in whose Rust builder differs by a comment: no build output is reused."""
    copy = root / "nixpkgs"
    shutil.copytree(ROOT / "tests" / "nixpkgs", copy)
    with (copy / "builder.sh").open("a") as builder:
        builder.write(f"# benchmark round {time.time_ns()}\n")
    return f"path:{copy}"


def nix_vs_cargo(registry: str, rounds: int) -> dict[str, float]:
    """Alternate a cold pipeline with the cargo backend and one with the nix backend."""
    cargo_times: list[float] = []
    nix_times: list[float] = []
    for _ in range(rounds):
        for backend in ("cargo", "nix"):
            cache = Path(tempfile.mkdtemp(prefix=f"fb-bench-{backend}-"))
            try:
                nixpkgs = _fresh_stand_in(cache) if backend == "nix" else None
                settings = Settings(cache_dir=cache, registry=registry, backend=backend, nixpkgs=nixpkgs)
                DirectoryRegistry(registry, cache).search("warm up")
                took = timed(lambda: Pipeline(settings).run(REQUEST, name="md"))
                (nix_times if backend == "nix" else cargo_times).append(took)
                root = settings.cache.gcroots / "md"
                if root.is_symlink():  # let nix-collect-garbage have the benchmark's builds
                    root.unlink()
            finally:
                shutil.rmtree(cache, ignore_errors=True)
    best_nix, best_cargo = min(nix_times), min(cargo_times)
    return {"nix_s": best_nix, "cargo_s": best_cargo, "ratio": best_nix / best_cargo}


def search_p50(registry: str, runs: int) -> dict[str, float]:
    cache = Path(tempfile.mkdtemp(prefix="fb-bench-search-"))
    queries = [
        "render markdown to html",
        "hex viewer",
        "sha256 hash",
        "base64 encode",
        "parse json",
        "regular expressions",
        "compress gzip",
        "command line arguments",
        "date and time",
        "http server",
    ]
    try:
        own = {"places": [Path(cache) / "index"], "system": None}  # a build measured, not the shared index found
        built = timed(lambda: DirectoryRegistry(registry, cache, **own).search("warm"))
        found = DirectoryRegistry(registry, cache, **own)
        crates = found._connect().execute("SELECT count(*) FROM crates").fetchone()[0]
        times = []
        for i in range(runs):
            query = queries[i % len(queries)]
            times.append(timed(lambda: search_stage.search(found, query, limit=10)))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return {
        "p50_ms": statistics.median(times) * 1000,
        "p95_ms": sorted(times)[int(runs * 0.95) - 1] * 1000,
        "crates": crates,
        "index_build_s": built,
    }


def search_accuracy(registry: str, rounds: int = 5) -> dict[str, object]:
    """Top-1/top-3 accuracy over tests/search_requests.toml per split, and the latency of those searches."""
    from flakebot_magic.host.fsutil import load_toml

    requests = load_toml(ROOT / "tests" / "search_requests.toml")["request"]
    cache = Path(tempfile.mkdtemp(prefix="fb-bench-accuracy-"))
    result: dict[str, object] = {}
    try:
        found = DirectoryRegistry(registry, cache)
        found.search("warm")
        times: list[float] = []
        for split in ("tune", "held-out"):
            chosen = [r for r in requests if r["split"] == split]
            top1 = top3 = 0
            for r in chosen:
                names = [c.name for c in search_stage.search(found, r["text"], limit=10)]
                top1 += bool(names) and names[0] in r["accept"]
                top3 += bool(set(names[:3]) & set(r["accept"]))
            result[split] = {"n": len(chosen), "top1": top1, "top3": top3}
        for _ in range(rounds):
            for r in requests:
                times.append(timed(lambda r=r: search_stage.search(found, r["text"], limit=10)))
        found.close()
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    times.sort()
    result["p50_ms"] = statistics.median(times) * 1000
    result["p95_ms"] = times[int(len(times) * 0.95) - 1] * 1000
    result["requests"] = len(requests)
    return result


def paraphrase_accuracy(registry: str, embedding_model: str | None = None) -> dict[str, object]:
    """Issue 20: top-1/3/10 and the fitness decision over tests/search_paraphrases.toml, per half, and over the
    blind set (all of it, and by its requests' half), and each query's latency (``embedding_model="off"``: words
    only). ``misses`` lists the blind cases not in the top 10 or wrongly deployed."""
    from flakebot_magic.testing.search_eval import (
        BLIND2,
        BLIND3,
        BLIND4,
        FRESH,
        evaluate,
        load_blind2_cases,
        load_blind3_cases,
        load_blind4_cases,
        load_cases,
        load_fresh_cases,
        summarize,
    )

    cases, fresh = load_cases(), load_fresh_cases()
    cache = Path(tempfile.mkdtemp(prefix="fb-bench-paraphrases-"))
    try:
        found = DirectoryRegistry(registry, cache, embedding_model=embedding_model)
        found.search("warm")
        result: dict[str, object] = dict(summarize(evaluate(found, cases)))
        blind = evaluate(found, fresh)
        result[FRESH] = summarize(blind)[FRESH]
        for half in ("tune", "held-out"):
            result[f"{FRESH} {half}"] = summarize(o for o in blind if o.case.half == half)[FRESH]
        for split, loaded in (
            (BLIND2, load_blind2_cases()),
            (BLIND3, load_blind3_cases()),
            (BLIND4, load_blind4_cases()),
        ):
            later = evaluate(found, loaded)
            result[split] = summarize(later)[split]
            for half in ("tune", "held-out"):
                result[f"{split} {half}"] = summarize(o for o in later if o.case.half == half)[split]
        result["misses"] = [
            {"request": o.case.request, "text": o.case.text, "verdict": o.verdict, "top3": list(o.ranked[:3])}
            for o in blind
            if not o.top(10) or o.verdict == "wrong"
        ]
        times, cpu = [], []
        for case in cases + fresh:
            before = time.process_time()
            times.append(timed(lambda c=case: search_stage.search(found, c.text, limit=10, prefer_bin=True)))
            cpu.append(time.process_time() - before)
        times.sort()
        result["semantic"] = not found.semantic_off
        found.close()
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    result["p50_ms"] = statistics.median(times) * 1000
    result["p95_ms"] = times[int(len(times) * 0.95) - 1] * 1000
    result["cpu_p50_ms"] = statistics.median(cpu) * 1000
    return result


_FRESH = """
import json, sys, time
from pathlib import Path
started = time.perf_counter()
from flakebot_magic.registry.directory import DirectoryRegistry
imported, cpu = time.perf_counter(), time.process_time()
# the index in this cache dir alone (not the machine's or the user's shared one): its build is what is measured
own = [Path(sys.argv[2]) / "index"]
registry = DirectoryRegistry(sys.argv[1], sys.argv[2], embedding_model=sys.argv[3] or None, places=own, system=None)
registry.search(sys.argv[4])
done = time.perf_counter()
print(json.dumps({"import_s": imported - started, "first_search_s": done - imported,
                  "first_search_cpu_s": time.process_time() - cpu}))
"""


def semantic_costs(registry: str) -> dict[str, object]:
    """Each in a fresh process, with the model and with words only: the whole index build (with its
    embeddings), then the first search of a process on that index (the model loaded on the way); wall
    time, and the process's CPU time (all its threads: what a loaded machine cannot inflate as much)."""
    result: dict[str, object] = {}
    for label, setting in (("semantic", ""), ("lexical", "off")):
        cache = Path(tempfile.mkdtemp(prefix=f"fb-bench-{label}-"))
        try:
            runs = []
            for query in ("warm", "how do I go through all subdirectories?"):  # the build, then a fresh process
                done = subprocess.run(
                    [sys.executable, "-c", _FRESH, registry, str(cache), setting, query],
                    capture_output=True,
                    text=True,
                    check=True,
                    cwd=ROOT,
                )
                runs.append(json.loads(done.stdout))
            result[label] = {
                "build_s": runs[0]["first_search_s"],
                "build_cpu_s": runs[0]["first_search_cpu_s"],
                "first_search_s": runs[1]["first_search_s"],
                "first_search_cpu_s": runs[1]["first_search_cpu_s"],
            }
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    return result


#: issue 20's five requests, as users typed them, and what each must give
ISSUE_REQUESTS = (
    ("Turn Markdown into HTML.", "pulldown-cmark", "*flake*"),
    ("make a string safe to use as a file name", "sanitize-filename", "report: draft/2?.txt"),
    ("encode text as a QR code", "qrcode", "flakebot"),
    ("convert a TOML file to JSON", "toml", None),
    ("make the text upper case", "heck", None),
)


def issue_requests(registry: str) -> dict[str, object]:
    """Each of :data:`ISSUE_REQUESTS` through the real pipeline (cargo backend, a cold cache): deployed and
    called, or a NeedsModelError naming the library in its first five."""
    from flakebot_magic.errors import FlakebotError, NeedsModelError

    cache = Path(tempfile.mkdtemp(prefix="fb-bench-issue20-"))
    outcomes: dict[str, object] = {}
    try:
        settings = Settings(cache_dir=cache, registry=registry, backend="cargo")
        for n, (request, crate, call) in enumerate(ISSUE_REQUESTS):
            started = time.perf_counter()
            try:
                tool = Pipeline(settings).run(request, name=f"issue{n}")
                out = tool(call, raw=True)  # a QR code is drawn with colour escapes: kept
                ok = tool.crate == crate and bool(out.strip())
                said = f"deployed {tool.crate}, {tool.name}({call!r}) wrote {len(out.splitlines())} line(s)"
            except NeedsModelError as refused:
                named = [c.name for c in refused.candidates[:5]]
                ok = call is None and crate in named
                said = f"NeedsModelError naming {', '.join(named)}"
            except FlakebotError as failed:
                ok, said = False, f"{type(failed).__name__}: {str(failed).splitlines()[0][:100]}"
            outcomes[request] = {"ok": ok, "said": said, "seconds": time.perf_counter() - started}
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return outcomes


def _paraphrase_rows(results: dict[str, dict[str, object]]) -> list[tuple[str, str, str]]:
    rows: list[tuple[str, str, str]] = []
    for key, ranker in (("paraphrases_lexical", "words only"), ("paraphrases", "words and meaning")):
        found = results.get(key)
        if not found:
            continue
        if key == "paraphrases" and not found.get("semantic", True):
            ranker = "words only: NO EMBEDDING MODEL INSTALLED"
        for split, label, target in (
            ("tune", "tuning half", "-"),
            ("held-out", "held-out half", "top-3 >= 0.95, top-10 >= 0.99, 0 wrong"),
            ("fresh", "blind set, all", "(the held-out targets)"),
            ("fresh tune", "blind set, requests of the tuning half", "-"),
            ("fresh held-out", "blind set, requests of the held-out half", "(the held-out targets)"),
            ("blind2", "second blind set (measured once, after issue 20's last tuning), all", "(the held-out targets)"),
            ("blind2 held-out", "second blind set, requests of the held-out half", "(the held-out targets)"),
            (
                "blind3",
                "third blind set (written before this round's tuning, measured once after), all",
                "(the held-out targets)",
            ),
            ("blind3 held-out", "third blind set, requests of the held-out half", "(the held-out targets)"),
            (
                "blind4",
                "fourth blind set (written before this round's tuning, measured once after), all",
                "(the held-out targets)",
            ),
            ("blind4 held-out", "fourth blind set, requests of the held-out half", "(the held-out targets)"),
        ):
            part: dict[str, float] = found[split]  # type: ignore[assignment]
            rows.append(
                (
                    f"paraphrases, {label} ({part['n']} paraphrases of {part['requests']} requests), {ranker}: "
                    "top-1 / top-3 / top-10; "
                    "fitness: right deploy / honest refusal / refusal missing the crate / **wrong deploy**",
                    f"{part['top1']:.2f} / **{part['top3']:.2f}** / **{part['top10']:.2f}**; "
                    f"{part['deploy']} / {part['refuse']} / {part['miss']} / **{part['wrong']}**",
                    target,
                )
            )
        rows.append(
            (
                f"search latency over the paraphrases, both sets (each query once), warm index, {ranker} "
                "(p50 / p95; CPU time p50)",
                f"**{found['p50_ms']:.2f} ms** / {found['p95_ms']:.2f} ms; {found['cpu_p50_ms']:.2f} ms",
                "p50 <= 10 ms",
            )
        )
    costs = results.get("semantic_costs")
    if costs:
        semantic, lexical = costs["semantic"], costs["lexical"]
        rows += [
            (
                "index build, whole registry, fresh process: with embeddings / words only (CPU time)",
                f"{semantic['build_s']:.1f} s / {lexical['build_s']:.1f} s "  # type: ignore[index]
                f"({semantic['build_cpu_s']:.1f} s / {lexical['build_cpu_s']:.1f} s)",  # type: ignore[index]
                "a few seconds",
            ),
            (
                "first search of a fresh process on a built index (model loaded): with the model / words only "
                "(CPU time)",
                f"{semantic['first_search_s'] * 1000:.0f} ms / {lexical['first_search_s'] * 1000:.0f} ms "  # type: ignore[index]
                f"({semantic['first_search_cpu_s'] * 1000:.0f} ms / {lexical['first_search_cpu_s'] * 1000:.0f} ms)",  # type: ignore[index]
                "-",
            ),
        ]
    for request, outcome in (results.get("issue20") or {}).items():
        done: dict[str, object] = outcome  # type: ignore[assignment]
        rows.append(
            (
                f"issue 20, real cargo: {request!r}",
                f"{'**ok**' if done['ok'] else '**not ok**'}: {done['said']} ({float(done['seconds']):.0f} s)",  # type: ignore[arg-type]
                "the right tool, or NeedsModelError naming the library",
            )
        )
    return rows


def _accuracy_rows(results: dict[str, dict[str, object]]) -> list[tuple[str, str, str]]:
    if "accuracy" not in results:
        return []
    acc = results["accuracy"]
    rows = []
    for split, label in (("tune", "tuning half"), ("held-out", "held-out half")):
        part = acc[split]
        assert isinstance(part, dict)
        n = part["n"]
        rows.append(
            (
                f"search accuracy, {label} of tests/search_requests.toml ({n} requests): top-1 / top-3",
                f"{part['top1'] / n:.2f} / **{part['top3'] / n:.2f}**",
                "top-3 >= 0.90 held out",
            )
        )
    rows.append(
        (
            f"search latency over those {acc['requests']} requests, warm index (p50 / p95)",
            f"**{acc['p50_ms']:.2f} ms** / {acc['p95_ms']:.2f} ms",
            "p50 <= 10 ms",
        )
    )
    return rows


def import_time(runs: int) -> dict[str, object]:
    probe = "import sys, flakebot_magic; print(','.join(m for m in ('openai','ipywidgets','tornado','IPython','httpx','numpy','tokenizers','safetensors','onnx','onnxruntime') if m in sys.modules))"
    times, loaded = [], ""
    baseline = []
    for _ in range(runs):
        times.append(timed(lambda: subprocess.run([sys.executable, "-c", "import flakebot_magic"], check=True)))
        baseline.append(timed(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True)))
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    return {
        "p50_ms": statistics.median(times) * 1000,
        "python_alone_ms": statistics.median(baseline) * 1000,
        "heavy_modules": loaded or "none",
    }


def _p50_ms(fn, runs: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


#: CPU time per call (ms) of the calling process, for each pair measured by :func:`_p50_pair_ms`, by label
PAIR_CPU_MS: dict[str, tuple[float, float]] = {}


def _p50_pair_ms(first, second, runs: int, label: str = "") -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """p50 of two calls alternated call by call, so both see the same (shared, busy) machine.

    With ``label``, the mean CPU time per call of this process for each goes to :data:`PAIR_CPU_MS` (the
    Python side's own work, which a loaded machine inflates far less than wall time).
    """
    a, b = [], []
    cpu_a = cpu_b = 0.0
    for _ in range(runs):
        started, cpu = time.perf_counter(), time.process_time()
        first()
        a.append(time.perf_counter() - started)
        cpu_a += time.process_time() - cpu
        started, cpu = time.perf_counter(), time.process_time()
        second()
        b.append(time.perf_counter() - started)
        cpu_b += time.process_time() - cpu
    if label:
        PAIR_CPU_MS[label] = (cpu_a / runs * 1000, cpu_b / runs * 1000)
    return statistics.median(a) * 1000, statistics.median(b) * 1000


def clients_bench(registry: str, runs: int = 400) -> dict[str, float]:
    """The clients beside their floors: CLI vs subprocess.run, MCP kept vs spawned, HTTP vs raw httpx."""
    import httpx

    from flakebot_magic.clients import stop_all
    from flakebot_magic.testing.overlay import FIXTURES, overlay_registry

    cache = Path(tempfile.mkdtemp(prefix="fb-bench-clients-"))
    try:
        overlay = overlay_registry(cache / "registry", [FIXTURES / "demo-mcp", FIXTURES / "demo-http"], Path(registry))
        settings = Settings(cache_dir=cache, registry=str(overlay), backend="cargo")
        md = Pipeline(settings).run(REQUEST, name="md")
        calc = Pipeline(settings).run("", crate="demo-mcp", name="calc")
        svc = Pipeline(settings).run("", crate="demo-http", name="svc")
        binary = str(md.binary)
        md("# Hi")  # reads --help once
        cli_tool_ms, cli_raw_ms = _p50_pair_ms(
            lambda: md("# Hi"), lambda: subprocess.run([binary], input=b"# Hi", capture_output=True), runs, "cli"
        )

        handshake = (
            b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},'
            b'"clientInfo":{"name":"bench","version":"0"}}}\n{"jsonrpc":"2.0","method":"notifications/initialized"}\n'
            b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"add","arguments":{"a":1,"b":2}}}\n'
        )

        def spawned() -> None:
            done = subprocess.run([str(calc.binary)], input=handshake, capture_output=True)
            assert b'"sum":3.0' in done.stdout

        for _ in range(200):
            calc.add(a=1, b=2)
        mcp_kept = _p50_ms(lambda: calc.add(a=1, b=2), runs * 5)
        mcp_spawned = _p50_ms(spawned, max(runs // 10, 20))

        svc.greet(name="a")  # starts the service: its URL and token exist from here
        raw = httpx.Client(base_url=svc.base_url, headers={"Authorization": f"Bearer {svc.token}"}, trust_env=False)
        try:
            for _ in range(200):
                svc.greet(name="a")
                raw.get("/greet", params={"name": "a"})
            http_tool_ms, http_raw_ms = _p50_pair_ms(
                lambda: svc.greet(name="a"), lambda: raw.get("/greet", params={"name": "a"}).json(), runs * 5, "http"
            )
            url, headers = f"{svc.base_url}/greet?name=a", {"Authorization": f"Bearer {svc.token}"}
            http_new = _p50_ms(lambda: httpx.get(url, headers=headers, trust_env=False).json(), max(runs // 4, 50))
        finally:
            raw.close()
        # confined (issue 33): in the sandbox, its own network namespace, reached through a Unix socket, beside
        # the same call unconfined, alternated in one loop
        with svc.confined():
            for _ in range(200):
                svc.greet(name="a")
            confined_ms = _p50_ms(lambda: svc.greet(name="a"), runs * 2)
        for _ in range(200):
            svc.greet(name="a")
        unconfined_ms = _p50_ms(lambda: svc.greet(name="a"), runs * 2)
        stop_all()
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return {
        "cli_tool_ms": cli_tool_ms,
        "cli_raw_ms": cli_raw_ms,
        "cli_ratio": cli_tool_ms / cli_raw_ms,
        "mcp_p50_ms": mcp_kept,
        "mcp_spawned_ms": mcp_spawned,
        "http_p50_ms": http_tool_ms,
        "http_raw_ms": http_raw_ms,
        "http_new_ms": http_new,
        "http_confined_ms": confined_ms,
        "http_unconfined_ms": unconfined_ms,
        "cli_cpu_ms": PAIR_CPU_MS["cli"][0],
        "cli_raw_cpu_ms": PAIR_CPU_MS["cli"][1],
        "http_cpu_ms": PAIR_CPU_MS["http"][0],
        "http_raw_cpu_ms": PAIR_CPU_MS["http"][1],
    }


def _client_rows(results: dict[str, dict[str, object]]) -> list[tuple[str, str, str]]:
    if "clients" not in results:
        return []
    c: dict[str, float] = results["clients"]  # type: ignore[assignment]
    return [
        (
            'CLI call `md("# Hi")` / raw `subprocess.run` of the same binary (p50)',
            f"{c['cli_tool_ms']:.2f} ms / {c['cli_raw_ms']:.2f} ms = **{c['cli_ratio']:.2f}x** (CPU time of the "
            f"caller per call: {c['cli_cpu_ms']:.3f} / {c['cli_raw_cpu_ms']:.3f} ms = "
            f"{c['cli_cpu_ms'] / c['cli_raw_cpu_ms']:.2f}x)",
            "<= 1.05x (issue 23)",
        ),
        (
            "MCP call round trip, server kept running (p50; spawning it per call)",
            f"**{c['mcp_p50_ms']:.3f} ms** ({c['mcp_spawned_ms']:.2f} ms)",
            "<= 0.3 ms",
        ),
        (
            "HTTP call with keep-alive, `svc.greet()` (p50; raw httpx keep-alive; raw httpx new connection): "
            f"{c['http_p50_ms'] / c['http_raw_ms']:.2f}x raw",
            f"**{c['http_p50_ms']:.3f} ms** ({c['http_raw_ms']:.3f} ms; {c['http_new_ms']:.2f} ms; CPU time of the "
            f"caller per call: {c['http_cpu_ms']:.3f} / {c['http_raw_cpu_ms']:.3f} ms = "
            f"{c['http_cpu_ms'] / c['http_raw_cpu_ms']:.2f}x)",
            "<= 1.05x raw (issue 23)",
        ),
        (
            "HTTP call confined (sandbox, own network, through a Unix socket and its forwarder) / unconfined (p50)",
            f"{c['http_confined_ms']:.3f} ms / {c['http_unconfined_ms']:.3f} ms = "
            f"**{c['http_confined_ms'] / c['http_unconfined_ms']:.2f}x**",
            "measured (issue 33)",
        ),
    ]


def _mcp_line(proc: subprocess.Popen[bytes], timeout: float) -> dict[str, object] | None:
    """One JSON-RPC message from a ``flakebot mcp`` child's stdout (None: nothing within ``timeout``)."""
    import select

    assert proc.stdout is not None
    if not select.select([proc.stdout], [], [], timeout)[0]:
        return None
    line = proc.stdout.readline()
    return json.loads(line) if line else None


def agent_bench(registry: str, runs: int = 2000, builds: int = 5) -> dict[str, float]:
    """``flakebot mcp`` (issue 15): how soon a build shows in tools/list; a built tool's call through it vs its own client.

    * list: ``builds`` cache-hit builds of the demo MCP server under new
      names, done in this process (elsewhere, for the server); for each, the
      time from the build's end to ``notifications/tools/list_changed`` on an
      open ``flakebot mcp`` session, and to a ``tools/list`` that has it;
      the slowest of each, target <= 100 ms;
    * call: ``calc.add`` through the tool's own client vs ``tools/call
      calc_add`` through ``flakebot mcp`` (the same JSON-RPC client code),
      alternated call by call, p50 difference, target <= 0.2 ms.
    """
    from flakebot_magic.clients import stop_all
    from flakebot_magic.clients.lifecycle import LogBuffer
    from flakebot_magic.clients.mcp import McpSession
    from flakebot_magic.testing.overlay import FIXTURES, overlay_registry

    cache = Path(tempfile.mkdtemp(prefix="fb-bench-agent-"))
    proc = None
    session = None
    try:
        overlay = overlay_registry(cache / "registry", [FIXTURES / "demo-mcp"], Path(registry))
        settings = Settings(cache_dir=cache, registry=str(overlay), backend="cargo")
        calc = Pipeline(settings).run("", crate="demo-mcp", name="calc")
        env = {**os.environ, "FLAKEBOT_CACHE_DIR": str(cache), "FLAKEBOT_BACKEND": "cargo"}
        argv = [FLAKEBOT, "mcp", "--registry", str(overlay)]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        assert proc.stdin is not None
        ident = 0

        def send(method: str, params: dict[str, object] | None = None, *, notify: bool = False) -> int:
            nonlocal ident
            ident += 1
            message: dict[str, object] = {"jsonrpc": "2.0", "method": method}
            if not notify:
                message["id"] = ident
            if params is not None:
                message["params"] = params
            assert proc is not None and proc.stdin is not None
            proc.stdin.write(json.dumps(message).encode() + b"\n")
            proc.stdin.flush()
            return ident

        def answer(wanted: int) -> dict[str, object]:
            while True:
                assert proc is not None
                message = _mcp_line(proc, 60)
                assert message is not None, "flakebot mcp did not answer"
                if message.get("id") == wanted:
                    return message

        send("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench"}})
        answer(ident)
        send("notifications/initialized", notify=True)

        def listed() -> set[str]:
            result = answer(send("tools/list"))["result"]
            return {str(t["name"]) for t in result["tools"]}  # type: ignore[index]

        listed()
        notified, visible = [], []
        for n in range(builds):
            name = f"calc{n}"
            Pipeline(settings).run("", crate="demo-mcp", name=name)  # a cache hit: its end is the moment it returns
            ended = time.perf_counter()
            note = _mcp_line(proc, 5)
            assert note is not None and note.get("method") == "notifications/tools/list_changed", note
            notified.append(time.perf_counter() - ended)
            while f"{name}_add" not in listed():
                pass
            visible.append(time.perf_counter() - ended)

        session = McpSession(argv, env=env, name="flakebot-mcp", logs=LogBuffer())
        session.start()

        def through_flakebot() -> None:
            assert session is not None
            result = session.request("tools/call", {"name": "calc_add", "arguments": {"a": 1, "b": 2}})
            assert result["structuredContent"] == {"sum": 3.0}

        for _ in range(300):
            calc.add(a=1, b=2)
            through_flakebot()
        own_ms, via_ms = _p50_pair_ms(lambda: calc.add(a=1, b=2), through_flakebot, runs)
    finally:
        if session is not None:
            session.stop()
        if proc is not None:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(30)
            if proc.stdout is not None:
                proc.stdout.close()
        stop_all()
        shutil.rmtree(cache, ignore_errors=True)
    return {
        "list_changed_max_ms": max(notified) * 1000,
        "list_changed_p50_ms": statistics.median(notified) * 1000,
        "tools_list_max_ms": max(visible) * 1000,
        "own_client_ms": own_ms,
        "via_mcp_ms": via_ms,
        "extra_ms": via_ms - own_ms,
    }


def _agent_rows(results: dict[str, dict[str, object]]) -> list[tuple[str, str, str]]:
    if "agent" not in results:
        return []
    a: dict[str, float] = results["agent"]  # type: ignore[assignment]
    return [
        (
            "`flakebot mcp`: a build's end to `tools/list` having it (slowest of 5; `list_changed` p50 / slowest)",
            f"**{a['tools_list_max_ms']:.1f} ms** ({a['list_changed_p50_ms']:.1f} ms / {a['list_changed_max_ms']:.1f} ms)",
            "<= 100 ms",
        ),
        (
            "`flakebot mcp`: `calc_add` through it / `calc.add` through its own client (p50, alternated)",
            f"{a['via_mcp_ms']:.3f} ms / {a['own_client_ms']:.3f} ms = **+{a['extra_ms']:.3f} ms**",
            "<= +0.2 ms",
        ),
    ]


def table(results: dict[str, dict[str, object]]) -> str:
    rows: list[tuple[str, str, str]] = []
    if "cold" in results:  # absent with --only-nix
        rows += _cargo_rows(results)
    if "nix_cold" in results:
        nix_cold, nix_warm = results["nix_cold"], results["nix_warm"]
        rows += [
            (
                "cold pipeline, nix backend / cargo backend (pulldown-cmark, nixpkgs stand-in)",
                f"{nix_cold['nix_s']:.1f} s / {nix_cold['cargo_s']:.1f} s = **{nix_cold['ratio']:.2f}x**",
                "<= 1.3x",
            ),
            (
                "warm re-run, nix backend, `flakebot build` command (p50)",
                f"**{nix_warm['command_p50_s']:.3f} s**",
                "<= 0.5 s",
            ),
            ("warm re-run, nix backend, in-process (p50)", f"{nix_warm['in_process_p50_s'] * 1000:.0f} ms", "<= 0.5 s"),
        ]
    rows += deps_rows(results)
    rows += candidate_rows(results)
    rows += sandbox_rows(results)
    rows += team_rows(results)
    rows += _client_rows(results)
    rows += _agent_rows(results)
    rows += eval_rows(results)
    lines = ["| measurement | result | target |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines)


def _search_row(search: dict[str, object]) -> tuple[str, str, str]:
    return (
        f"search, warm index over {search['crates']} crates (p50 / p95)",
        f"**{search['p50_ms']:.2f} ms** / {search['p95_ms']:.2f} ms",
        "<= 10 ms",
    )


def _import_rows(imp: dict[str, object]) -> list[tuple[str, str, str]]:
    return [
        (
            "`python -c 'import flakebot_magic'` (p50; python alone)",
            f"**{imp['p50_ms']:.0f} ms** ({imp['python_alone_ms']:.0f} ms)",
            "<= 150 ms",
        ),
        ("heavy modules imported by `import flakebot_magic`", str(imp["heavy_modules"]), "none"),
    ]


def _cold_row(cold: dict[str, object], crate: str = "pulldown-cmark") -> tuple[str, str, str]:
    return (
        f"cold pipeline ({crate}) / plain `cargo build --release`",
        f"{cold['pipeline_s']:.1f} s / {cold['cargo_s']:.1f} s = **{cold['ratio']:.2f}x**",  # type: ignore[str-format]
        "<= 1.15x",
    )


def _second_name_row(cold: dict[str, object]) -> tuple[str, str, str]:
    return (
        "the same crate under a second name, rebuilt (its proof reused: cargo test runs in "
        f"{cold['second_tests_run']} of the rounds) / plain `cargo build --release`",
        f"{cold['second_s']:.1f} s / {cold['cargo_s']:.1f} s = **{cold['second_ratio']:.2f}x**",  # type: ignore[str-format]
        "no cargo test",
    )


def _cargo_rows(results: dict[str, dict[str, object]]) -> list[tuple[str, str, str]]:
    cold, warm_, search, imp = results["cold"], results["warm"], results["search"], results["import"]
    rows = [
        _cold_row(cold),
        _cold_row(results["cold_hexyl"], "hexyl"),
        _second_name_row(cold),
        ("warm re-run, `flakebot build` command (p50)", f"**{warm_['command_p50_s']:.3f} s**", "<= 0.5 s"),
        (
            "warm re-run, `flakebot_magic.build()` in-process (p50)",
            f"{warm_['in_process_p50_s'] * 1000:.0f} ms",
            "<= 0.5 s",
        ),
        _search_row(search),
        ("index build, whole registry (once per registry change)", f"{search['index_build_s']:.2f} s", "-"),
        *_import_rows(imp),
    ]
    rows += _accuracy_rows(results)
    rows += _paraphrase_rows(results)
    rows += _edit_rows(results)
    return rows


def _print_only(found: dict[str, dict[str, object]], rows: list[tuple[str, str, str]], json_path: Path | None) -> int:
    """Print the rows of a partial run (``--only-*``), and its raw numbers to ``json_path``."""
    lines = ["| measurement | result | target |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows]
    print("\n".join(lines))
    if json_path:
        json_path.write_text(json.dumps(found, indent=2, default=str))
    return 0


def merge_rows(old: str, new: str) -> str:
    r"""The table ``new`` merged into the table ``old``: rows keyed by their first cell, ``new``'s replacing
    ``old``'s, ``old``'s others kept in place, ``new``'s others added; lines that are no rows (the machine's
    line) from ``new``.

    >>> old = "| measurement | result | target |\n|---|---|---|\n| a | 1 | - |\n| b | 2 | - |\n\nMeasured then."
    >>> print(merge_rows(old, "| measurement | result | target |\n|---|---|---|\n| b | 3 | - |\n| c | 4 | - |\n\nNow."))
    | measurement | result | target |
    |---|---|---|
    | a | 1 | - |
    | b | 3 | - |
    | c | 4 | - |
    <BLANKLINE>
    Now.
    """

    def rows(text: str) -> list[str]:
        return [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| measurement")]

    def key(row: str) -> str:
        return row.split(" | ", 1)[0]

    fresh = {key(r): r for r in rows(new)}
    merged = [fresh.pop(key(r), r) for r in rows(old)] + list(fresh.values())
    tail = [line for line in new.splitlines() if line and not line.startswith("|")]
    return "\n".join(["| measurement | result | target |", "|---|---|---|", *merged, "", *tail])


def write_docs(path: Path, text: str) -> None:
    """Write ``text`` (a run's table) into ``path`` between its markers, merged with the rows already there."""
    content = path.read_text()
    found = re.search(r"(<!-- bench:start -->\n)(.*?)(\n<!-- bench:end -->)", content, flags=re.S)
    if found is None:
        raise SystemExit(f"{path} has no <!-- bench:start --> ... <!-- bench:end --> section to write")
    merged = merge_rows(found.group(2), text)
    path.write_text(content[: found.start(2)] + merged + content[found.end(2) :])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--registry", default=str(DEBIAN_REGISTRY))
    parser.add_argument("--cold-rounds", type=int, default=2)
    parser.add_argument("--no-docs", action="store_true", help="do not write the table into docs/benchmarks.md")
    parser.add_argument("--json", type=Path, help="also write the raw numbers here")
    parser.add_argument("--no-edit", action="store_true", help="skip the edit-loop rows")
    parser.add_argument("--only-edit", action="store_true", help="measure only the edit-loop rows")
    parser.add_argument(
        "--only-cold",
        action="store_true",
        help="measure only the cold pipeline beside a plain cargo build, and the same crate under a second name",
    )
    parser.add_argument("--no-nix", action="store_true", help="skip the nix backend rows")
    parser.add_argument("--only-nix", action="store_true", help="measure only the nix backend rows")
    parser.add_argument("--no-clients", action="store_true", help="skip the tool-client rows")
    parser.add_argument("--only-clients", action="store_true", help="measure only the tool-client rows")
    parser.add_argument(
        "--only-search",
        action="store_true",
        help="measure only import time, search latency and accuracy (requests, paraphrases, issue 20's five requests)",
    )
    parser.add_argument(
        "--no-issue-requests", action="store_true", help="skip building issue 20's five requests with real cargo"
    )
    parser.add_argument("--no-agent", action="store_true", help="skip the flakebot mcp rows")
    parser.add_argument("--only-agent", action="store_true", help="measure only the flakebot mcp rows")
    parser.add_argument("--no-candidates", action="store_true", help="skip the speculative-candidates rows")
    parser.add_argument("--only-candidates", action="store_true", help="measure only the speculative-candidates rows")
    parser.add_argument("--no-eval", action="store_true", help="skip the starter suite's reference run")
    parser.add_argument("--only-eval", action="store_true", help="measure only the starter suite's reference run")
    parser.add_argument("--no-sandbox", action="store_true", help="skip the sandbox-cost rows")
    parser.add_argument("--only-sandbox", action="store_true", help="measure only the sandbox's cost per cargo command")
    parser.add_argument("--no-team", action="store_true", help="skip the team rows (push, a teammate's pull)")
    parser.add_argument("--only-team", action="store_true", help="measure only a teammate's pull vs a cold build")
    parser.add_argument("--no-deps", action="store_true", help="skip the dependency cache's rows (issue 39)")
    parser.add_argument("--only-deps", action="store_true", help="measure only the dependency cache's rows (issue 39)")
    args = parser.parse_args()
    if args.only_deps:
        found = deps_measure(args.registry, nix_stand_in=_fresh_stand_in)
        return _print_only(found, deps_rows(found), args.json)
    if args.only_team:
        found = {"team": team_bench(args.registry, args.cold_rounds, _fresh_stand_in)}
        return _print_only(found, team_rows(found), args.json)
    if args.only_sandbox:
        found = {"sandbox": sandbox_bench(args.registry)}
        return _print_only(found, sandbox_rows(found), args.json)
    if args.only_eval:
        found = {"eval": eval_bench(args.registry)}
        return _print_only(found, eval_rows(found), args.json)
    if args.only_candidates:
        found = {"candidates": candidates_bench(args.registry)}
        return _print_only(found, candidate_rows(found), args.json)
    if args.only_agent:
        found = {"agent": agent_bench(args.registry)}
        return _print_only(found, _agent_rows(found), args.json)
    if args.only_search:
        found = {
            "import": import_time(9),
            "search": search_p50(args.registry, 200),
            "accuracy": search_accuracy(args.registry),
            "paraphrases": paraphrase_accuracy(args.registry),
            "paraphrases_lexical": paraphrase_accuracy(args.registry, "off"),
            "semantic_costs": semantic_costs(args.registry),
        }
        if not args.no_issue_requests:
            print("benchmark: issue 20's five requests, real cargo (a few minutes) ...", file=sys.stderr)
            found["issue20"] = issue_requests(args.registry)
        rows = [
            *_import_rows(found["import"]),
            _search_row(found["search"]),
            *_accuracy_rows(found),
            *_paraphrase_rows(found),
        ]
        return _print_only(found, rows, args.json)
    if args.only_clients:
        found = {"clients": clients_bench(args.registry)}
        return _print_only(found, _client_rows(found), args.json)
    if args.only_cold:
        found = {
            "cold": cold_vs_cargo(args.registry, args.cold_rounds),
            "cold_hexyl": cold_vs_cargo(args.registry, args.cold_rounds, crate="hexyl"),
        }
        rows = [_cold_row(found["cold"]), _cold_row(found["cold_hexyl"], "hexyl"), _second_name_row(found["cold"])]
        return _print_only(found, rows, args.json)
    if args.only_edit:
        found = {"edit": edit_loop_overhead(args.registry)}
        return _print_only(found, _edit_rows(found), args.json)
    if not (Path(args.registry) / "pulldown-cmark-0.9.2").is_dir():
        print("the offline registry is missing: run `make install` first", file=sys.stderr)
        return 1
    results: dict[str, dict[str, object]] = {}
    if not args.only_nix:
        print("benchmark: import time ...", file=sys.stderr)
        results["import"] = import_time(9)
        print("benchmark: search ...", file=sys.stderr)
        results["search"] = search_p50(args.registry, 200)
        results["accuracy"] = search_accuracy(args.registry)
        results["paraphrases"] = paraphrase_accuracy(args.registry)
        results["paraphrases_lexical"] = paraphrase_accuracy(args.registry, "off")
        results["semantic_costs"] = semantic_costs(args.registry)
        if not args.no_issue_requests:
            print("benchmark: issue 20's five requests, real cargo (a few minutes) ...", file=sys.stderr)
            results["issue20"] = issue_requests(args.registry)
        print("benchmark: warm re-run ...", file=sys.stderr)
        results["warm"] = warm(args.registry, 7)
        print(f"benchmark: cold pipeline vs cargo ({args.cold_rounds} rounds, a few minutes) ...", file=sys.stderr)
        results["cold"] = cold_vs_cargo(args.registry, args.cold_rounds)
        results["cold_hexyl"] = cold_vs_cargo(args.registry, args.cold_rounds, crate="hexyl")
    if shutil.which("nix") and not args.no_nix:
        stand_in = f"path:{ROOT / 'tests' / 'nixpkgs'}"
        print("benchmark: nix backend, warm re-run ...", file=sys.stderr)
        results["nix_warm"] = warm(args.registry, 7, backend="nix", nixpkgs=stand_in)
        print(f"benchmark: nix backend vs cargo backend, cold ({args.cold_rounds} rounds) ...", file=sys.stderr)
        results["nix_cold"] = nix_vs_cargo(args.registry, args.cold_rounds)
        if not args.no_team:
            print(f"benchmark: a teammate's pull vs a cold nix build ({args.cold_rounds} rounds) ...", file=sys.stderr)
            results["team"] = team_bench(args.registry, args.cold_rounds, _fresh_stand_in)
    if not args.no_deps and not args.only_nix:
        print(
            "benchmark: the dependency cache (second tools, ten tools, a warm build; many minutes) ...", file=sys.stderr
        )
        results.update(deps_measure(args.registry, nix_stand_in=None if args.no_nix else _fresh_stand_in))
    if not args.no_edit and (Path(args.registry) / "sha2-0.10.5").is_dir():
        print("benchmark: edit loop (scripted session on sha2, real cargo) ...", file=sys.stderr)
        results["edit"] = edit_loop_overhead(args.registry)
    if not args.no_candidates and not args.only_nix and (Path(args.registry) / "sha2-0.10.5").is_dir():
        print("benchmark: speculative candidates, 3 vs 1 (scripted sessions on sha2, real cargo) ...", file=sys.stderr)
        results["candidates"] = candidates_bench(args.registry)
    if not args.no_sandbox and not args.only_nix:
        print("benchmark: the sandbox's cost per cargo command ...", file=sys.stderr)
        results["sandbox"] = sandbox_bench(args.registry)
    if not args.no_clients and not args.only_nix:
        print("benchmark: tool clients (CLI, MCP, HTTP) ...", file=sys.stderr)
        results["clients"] = clients_bench(args.registry)
    if not args.no_agent and not args.only_nix:
        print("benchmark: flakebot mcp (tools/list after a build, a call through it) ...", file=sys.stderr)
        results["agent"] = agent_bench(args.registry)
    if not args.no_eval and not args.only_nix:
        print(
            "benchmark: flakebot eval --reference of the starter suite (real cargo, about 10 minutes) ...",
            file=sys.stderr,
        )
        results["eval"] = eval_bench(args.registry)
    machine = f"{os.cpu_count()} cores, {subprocess.run(['rustc', '--version'], capture_output=True, text=True, env={**os.environ, 'PATH': os.path.dirname(find_cargo()) + os.pathsep + os.environ['PATH']}).stdout.strip()}, {time.strftime('%Y-%m-%d')}"
    text = table(results) + f"\n\nMeasured by `make bench` on {machine}."
    print(text)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    if not args.no_docs:
        write_docs(ROOT / "docs" / "benchmarks.md", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
