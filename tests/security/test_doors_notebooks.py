"""Row "notebook files and their metadata" of the matrix (docs/SECURITY.md): a shared notebook's recorded request
is words, never code, never the person's examples.

A notebook someone shares records, in its outputs' metadata, the request its tool was built from. When a pull of
that tool is refused (no trusted key signed it, the cache does not hold it), ``--if-untrusted rebuild`` builds it
here from that recorded request: before issue 33 its ``>>>`` lines were acceptance examples, run with ``exec`` in
flakebot's process (the red team's third door). Here the notebook carries the payload of ``door_payloads`` and
each door of the pull rebuilds from it: the function the command and the magic call, the ``flakebot pull``
command, and ``%flakebot pull NAME NOTEBOOK --rebuild``; nothing runs.

The cache is an empty local nix store, so the pull is refused (real nix) and the rebuild is a real cargo build.
"""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import pytest
from door_payloads import assert_nothing_ran, runs_if_code
from tinycrates import write_registry

from flakebot_magic.cli import main as cli_main
from flakebot_magic.config import Settings
from flakebot_magic.pipeline.team import line_command, notebook_provenance, pull

pytestmark = [
    pytest.mark.cargo,
    pytest.mark.nix,
    pytest.mark.skipif(shutil.which("nix") is None, reason="nix is not installed (run scripts/setup-nix.sh as root)"),
]

STAND_IN = Path(__file__).resolve().parents[2] / "tests" / "nixpkgs"
NAR = "sha256-" + base64.b64encode(bytes(32)).decode()


def _notebook(path: Path, name: str, request: str) -> Path:
    recorded = {
        "name": name,
        "crate": "tinyecho",
        "request": request,
        "nix_store_path": "/nix/store/" + "0" * 32 + "-tinyecho-0.1.0",
        "nar_hash": NAR,
        "proof_store_path": "/nix/store/" + "1" * 32 + "-flakebot-proof-tinyecho-0.1.0",
        "proof_nar_hash": NAR,
    }
    cell = {
        "cell_type": "code",
        "source": f"%%flakebot --name {name}\n",
        "metadata": {},
        "outputs": [{"output_type": "display_data", "data": {"text/plain": name}, "metadata": {"flakebot": recorded}}],
    }
    path.write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_a_shared_notebooks_recorded_request_is_rebuilt_as_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = write_registry(tmp_path / "registry", ["tinyecho"])
    empty = tmp_path / "empty-cache"
    empty.mkdir()
    markers = {door: tmp_path / f"{door}-ran" for door in ("pull", "command", "magic")}
    settings = Settings(
        cache_dir=tmp_path / "cache",
        registry=str(registry),
        backend="nix",  # a refused pull rebuilds with nix here, and compares with the recorded path
        nixpkgs=f"path:{STAND_IN}",
        nix_substituters=f"file://{empty}",
        nix_trusted_public_keys="team-test-1:" + base64.b64encode(bytes(32)).decode(),
    )
    # the function behind both doors
    notebook = _notebook(tmp_path / "shared.ipynb", "echo1", "echo words\n" + runs_if_code(markers["pull"], "echo1"))
    pulled = pull(settings, "echo1", notebook_provenance(notebook, "echo1"), if_untrusted="rebuild")
    assert pulled.refused and pulled.tool("hi").strip().lower() == "hi"  # refused, then built here
    assert_nothing_ran(markers["pull"], pulled.tool, source="a shared notebook's recorded request (pull)")
    # `flakebot pull NAME --from NOTEBOOK --if-untrusted rebuild`
    notebook = _notebook(
        tmp_path / "shared2.ipynb", "echo2", "echo words\n" + runs_if_code(markers["command"], "echo2")
    )
    monkeypatch.setenv("FLAKEBOT_REGISTRY", str(registry))
    monkeypatch.setenv("FLAKEBOT_BACKEND", "nix")
    monkeypatch.setenv("FLAKEBOT_NIXPKGS", f"path:{STAND_IN}")
    code = cli_main(
        [
            "pull",
            "echo2",
            "--from",
            str(notebook),
            "--if-untrusted",
            "rebuild",
            "--cache-dir",
            str(settings.cache_dir),
            "--substituters",
            f"file://{empty}",
            "--trusted-public-keys",
            str(settings.nix_trusted_public_keys),
        ]
    )
    assert code == 0
    assert_nothing_ran(markers["command"], source="a shared notebook's recorded request (flakebot pull)")
    # `%flakebot pull NAME NOTEBOOK --rebuild`
    notebook = _notebook(tmp_path / "shared3.ipynb", "echo3", "echo words\n" + runs_if_code(markers["magic"], "echo3"))
    answer = line_command(settings, "pull", ["echo3", str(notebook)], rebuild=True)
    assert answer.tool("hi").strip().lower() == "hi"  # type: ignore[attr-defined]
    assert_nothing_ran(markers["magic"], answer.tool, source="a shared notebook's request (%flakebot pull)")  # type: ignore[attr-defined]
