"""A team's tool from the cache vs built from scratch (issue 24): a teammate's first call, pulled, beside a cold build.

Each round, with real nix, a real signing key and a real ``file://`` cache:

1. Alice builds pulldown-cmark cold with the nix backend (a fresh copy of the
   nixpkgs stand-in, so nothing comes from /nix/store): what a teammate
   without the cache would wait for;
2. she pushes the tool and its proof, signed (``flakebot push``'s code);
3. Bob, with an empty flakebot cache and an empty second nix store (a chroot
   store, ``local?root=…``), pulls the tool the notebook recorded (narHash
   and signature checked, proof read) and calls it once: ``md("# Hi")``.

Reported: the cold build, the push, Bob's pull and the pull with his first
call, and the ratio pull-and-call / cold build (target <= 0.1, i.e. >= 10x
faster), the best of the rounds for each.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flakebot_magic.config import Settings
from flakebot_magic.pipeline import Pipeline, team
from flakebot_magic.records.provenance import provenance_of

REQUEST = "render markdown to html"


def _keys(folder: Path) -> tuple[Path, str]:
    secret = folder / "secret-key"
    secret.write_text(
        subprocess.run(
            ["nix", "--extra-experimental-features", "nix-command", "key", "generate-secret", "--key-name", "bench-1"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    public = subprocess.run(
        ["nix", "--extra-experimental-features", "nix-command", "key", "convert-secret-to-public"],
        input=secret.read_text(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return secret, public


def team_bench(registry: str, rounds: int, fresh_stand_in: Callable[[Path], str]) -> dict[str, Any]:
    """``rounds`` rounds of cold build, push, pull and first call; the best of each."""
    cold: list[float] = []
    pushed: list[float] = []
    pulled: list[float] = []
    first_call: list[float] = []
    for _ in range(rounds):
        root = Path(tempfile.mkdtemp(prefix="fb-bench-team-"))
        try:
            secret, public = _keys(root)
            cache = f"file://{root / 'cache'}"
            alice = Settings(cache_dir=root / "alice", registry=registry, backend="nix", nixpkgs=fresh_stand_in(root))
            started = time.perf_counter()
            md: Any = Pipeline(alice).run(REQUEST, name="md")
            cold.append(time.perf_counter() - started)
            started = time.perf_counter()
            team.push(alice, "md", to=cache, secret_key=str(secret))
            pushed.append(time.perf_counter() - started)
            recorded = provenance_of(md)
            bob = Settings(
                cache_dir=root / "bob",
                registry=registry,
                backend="nix",
                nix_store=f"local?root={root / 'bob-store'}",
                nix_substituters=cache,
                nix_trusted_public_keys=public,
            )
            started = time.perf_counter()
            got = team.pull(bob, "md", recorded).tool
            pulled.append(time.perf_counter() - started)
            assert got("# Hi") == "<h1>Hi</h1>\n"
            first_call.append(time.perf_counter() - started)
            for name in ("md", ".proofs/md"):  # let nix-collect-garbage have the benchmark's builds
                link = alice.cache.gcroots / name
                if link.is_symlink():
                    link.unlink()
        finally:
            shutil.rmtree(root, ignore_errors=True)
    best_cold, best_call = min(cold), min(first_call)
    return {
        "rounds": rounds,
        "cold_s": best_cold,
        "push_s": min(pushed),
        "pull_s": min(pulled),
        "pull_and_call_s": best_call,
        "ratio": best_call / best_cold,
    }


def team_rows(results: dict[str, dict[str, Any]]) -> list[tuple[str, str, str]]:
    """The table rows: the teammate's pull and first call beside the cold build, and the push."""
    found = results.get("team")
    if not found:
        return []
    return [
        (
            "a teammate's first call, pulled from the signed cache (narHash and signature checked) / "
            "cold nix build of the same tool (pulldown-cmark)",
            f"{found['pull_and_call_s']:.2f} s / {found['cold_s']:.1f} s = **{found['ratio']:.3f}x** "
            f"({1 / found['ratio']:.0f}x faster)",
            "<= 0.1x",
        ),
        (
            "`flakebot push` (tool and proof, signed, to file://) / `flakebot pull` alone",
            f"{found['push_s']:.2f} s / {found['pull_s']:.2f} s",
            "-",
        ),
    ]
