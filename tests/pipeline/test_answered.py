"""A warm re-run answers from the record: the tool built under this name for this very request, no search, no model.

Issue 39, item 5: ``flakebot build WORDS --name NAME`` of a tool already built for those words under that name
is a recipe hit that must load nothing it does not need (the sentence-embedding model above all: 635 MB
resident and 0.7 s). Each run here is a fresh ``flakebot`` process, as a user's is; it reports what it
imported and its peak memory. Anything that changes the answer (other words, ``--rebuild``, another crate)
takes the usual way, search included.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tinycrates import write_registry

from flakebot_magic.sandbox import bubblewrap_works

pytestmark = [
    pytest.mark.cargo,
    pytest.mark.skipif(bool(bubblewrap_works()), reason=f"no working bubblewrap: {bubblewrap_works()}"),
]

WORDS = "echo words or shout standard input"
#: runs the command's main() and reports what it loaded: the model's libraries, and the peak resident memory (this
#: process's own: VmHWM, not getrusage, which counts what the parent held when it forked)
PROBE = """
import json, sys
from flakebot_magic.cli import main
code = main(sys.argv[1:])
heavy = sorted(m for m in ("numpy", "onnxruntime", "tokenizers", "safetensors") if m in sys.modules)
status = open("/proc/self/status").read().split("VmHWM:")[1].split()
peak = int(status[0]) * 1024
print(json.dumps({"code": code, "heavy": heavy, "peak": peak}), file=sys.stderr)
"""


def _flakebot(cache: Path, registry: Path, *args: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "build", *args, "-r", str(registry), "--cache-dir", str(cache), "--quiet"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    report: dict[str, object] = json.loads(done.stderr.strip().splitlines()[-1])
    assert report["code"] == 0, done.stderr
    return report


def _search_row(cache: Path, log: str) -> str:
    return next(
        line
        for line in (cache / "logs" / log).read_text().splitlines()
        if "== search " in line and "started" not in line
    )


@pytest.fixture
def built(tmp_path: Path) -> tuple[Path, Path]:
    registry = write_registry(tmp_path / "registry", ["tinyecho", "tinylib"])
    cache = tmp_path / "cache"
    _flakebot(cache, registry, WORDS, "--name", "shout", "--backend", "cargo")
    return cache, registry


def test_a_warm_rerun_answers_from_the_record_without_the_model(built: tuple[Path, Path]) -> None:
    cache, registry = built
    report = _flakebot(cache, registry, WORDS, "--name", "shout", "--backend", "cargo")
    assert "search cached" in _search_row(cache, "shout.cached.log")
    assert report["heavy"] == [], f"a warm re-run loaded the model's libraries: {report['heavy']}"
    assert isinstance(report["peak"], int) and report["peak"] < 150 << 20, f"peak resident memory {report['peak']}"


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(("echo words, or shout standard input loudly", "--name", "shout"), id="other-words"),
        pytest.param((WORDS, "--name", "shout", "--rebuild"), id="rebuild"),
        pytest.param((WORDS, "--name", "shout", "--crate", "tinylib"), id="another-crate"),
    ],
)
def test_anything_else_searches_as_before(built: tuple[Path, Path], args: tuple[str, ...]) -> None:
    cache, registry = built
    done = subprocess.run(
        [sys.executable, "-m", "flakebot_magic.cli", "build", *args, "-r", str(registry), "--cache-dir", str(cache)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "FLAKEBOT_BACKEND": "cargo"},
    )
    logs = sorted((cache / "logs").glob("shout*.log"), key=lambda p: p.stat().st_mtime)
    row = _search_row(cache, logs[-1].name)
    assert "search cached" not in row, (row, done.stderr[-500:])
