"""One store-manifest schema for both backends: the same keys, with model, iterations, tests, flags and backend."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flakebot_magic.backends import MANIFEST_KEYS, Built
from flakebot_magic.backends.base import manifest
from flakebot_magic.config import Settings
from flakebot_magic.manage.tools import describe
from flakebot_magic.pipeline import Pipeline
from flakebot_magic.records.inventory import Inventory
from flakebot_magic.registry.base import CrateCandidate
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.request import BuildRequest
from flakebot_magic.sandbox.diagnostics import TestReport
from flakebot_magic.stages.fork import Workspace
from flakebot_magic.stages.state import BackendChoice, RunState
from flakebot_magic.testing.fake_openai import FakeOpenAIServer

#: the nixpkgs stand-in the nix tests build against (see tests/nixpkgs)
STAND_IN = Path(__file__).resolve().parents[2] / "tests" / "nixpkgs"
#: what write_entry adds to every manifest
#: what the store adds to a manifest (write_entry), and the digests of the binaries deploy() copied
ENTRY_KEYS = {"hash", "format", "tools", "digests"}


def _run(tmp_path: Path) -> RunState:
    crate = CrateCandidate("tinyecho", "0.2.0", description="Echo words", has_bin=True, bin_names=("tinyecho",))
    workspace = Workspace(tmp_path, crate, checksum="abc", checksum_kind="sha256", published_commit="0" * 40)
    run = RunState(BuildRequest("echo"), None, BackendChoice("cargo", "asked for"), candidate=crate, name="tinyecho")
    run.workspace, run.rustc = workspace, "rustc 1.70.0"
    return run


def test_both_backends_write_the_same_keys(tmp_path: Path) -> None:
    run = _run(tmp_path)
    built = Built(key="k", flags=["build", "--release"], binaries={"tinyecho": tmp_path / "tinyecho"})
    built.tests = TestReport(passed=3, failed=0, ignored=1)
    cargo = manifest(run, "cargo", built, commit="c" * 40, contract={"kind": "cli", "bin": "tinyecho"})
    nix = manifest(
        run,
        "nix",
        built,
        commit="c" * 40,
        contract={},
        gcroot="/g",
        lock_hash="sha256-x",
        nixpkgs={"type": "path"},
        nixpkgs_url="path:/n",
    )
    assert sorted(cargo) == sorted(nix) == sorted(MANIFEST_KEYS)
    assert cargo["tests"] == {"passed": 3, "failed": 0, "ignored": 1}
    assert (cargo["backend"], nix["backend"], cargo["model"], cargo["iterations"]) == ("cargo", "nix", "", 0)
    assert (cargo["lock_hash"], nix["lock_hash"]) == ("", "sha256-x")
    with pytest.raises(TypeError):
        manifest(run, "nix", built, commit="", contract={}, not_a_key=1)


def _keys(store_path: Path) -> set[str]:
    return set(json.loads((store_path / "manifest.json").read_text())) - ENTRY_KEYS


@pytest.mark.cargo
def test_a_cargo_build_records_tests_flags_and_no_model(session_registry: DirectoryRegistry, tmp_path: Path) -> None:
    settings = Settings(cache_dir=tmp_path, registry=str(session_registry.path), backend="cargo")
    tool = Pipeline(settings).run(BuildRequest("", crate="tinyecho"))
    data = json.loads((Path(tool.store_path) / "manifest.json").read_text())
    assert set(data) - ENTRY_KEYS == set(MANIFEST_KEYS)
    assert data["backend"] == "cargo" and data["flags"] and data["model"] == "" and data["iterations"] == 0
    assert data["tests"]["failed"] == 0 and data["tests"]["passed"] >= 0
    record = Inventory(settings.cache.tools).get("tinyecho")
    assert record is not None and (record.model, record.iterations) == ("", 0)


@pytest.mark.nix
@pytest.mark.cargo
def test_a_nix_build_writes_the_cargo_keys_too(
    nix_ready: None, session_registry: DirectoryRegistry, tmp_path: Path
) -> None:
    settings = Settings(
        cache_dir=tmp_path, registry=str(session_registry.path), backend="nix", nixpkgs=f"path:{STAND_IN}"
    )
    tool = Pipeline(settings).run(BuildRequest("", crate="tinyecho"))
    record = Inventory(settings.cache.tools).get("tinyecho")
    assert record is not None
    entry = Path(record.store_path)  # the cache entry; the tool itself is the /nix/store path
    assert _keys(entry) == set(MANIFEST_KEYS)
    data = json.loads((entry / "manifest.json").read_text())
    assert data["backend"] == "nix" and data["nix_store_path"] == str(tool.store_path)
    # the flake caps lints for rustc and rustdoc: the cap is in the flags and so in the store hash
    assert data["flags"] == ["nix", "build", "packages.default", "--cap-lints", "warn"]
    assert data["tests"]["failed"] == 0
    assert data["nixpkgs_url"] == f"path:{STAND_IN}" and data["lock_hash"].startswith("sha256-")


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


#: one scripted session (a test double, not a model): declare the tool contract, finish
CONTRACT_SCRIPT = [
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {**call, "id": f"call_{i}"}
            for i, call in enumerate(
                [
                    _call(
                        "replace_in_file",
                        path="Cargo.toml",
                        search='keywords = ["echo", "shout"]\n',
                        replace='keywords = ["echo", "shout"]\n\n[package.metadata.flakebot]\nkind = "cli"\nbin = "tinyecho"\n',
                    ),
                    _call("finish", summary="tinyecho is the tool"),
                ]
            )
        ],
    },
]


@pytest.mark.cargo
def test_a_model_built_tool_records_its_model_and_iterations(
    session_registry: DirectoryRegistry, tmp_path: Path
) -> None:
    with FakeOpenAIServer(CONTRACT_SCRIPT) as server:
        settings = Settings(
            cache_dir=tmp_path,
            registry=str(session_registry.path),
            backend="cargo",
            model="scripted-test-double",
            base_url=server.base_url,
        )
        tool = Pipeline(settings).run(BuildRequest("shout standard input", crate="tinyecho", name="shout"))
    data = json.loads((Path(tool.store_path) / "manifest.json").read_text())
    assert set(data) - ENTRY_KEYS == set(MANIFEST_KEYS)
    assert data["model"] == "scripted-test-double" and data["iterations"] >= 1
    record = Inventory(settings.cache.tools).get("shout")
    assert record is not None and (record.model, record.iterations) == (data["model"], data["iterations"])
    shown = describe(settings, "shout")
    assert (shown["model"], shown["iterations"]) == ("scripted-test-double", data["iterations"])
