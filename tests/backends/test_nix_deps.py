"""Dependencies as their own derivation (issue 39, item 3): real nix, the nixpkgs stand-in.

Two different tools asking for the very same dependencies have the same ``flakebot-deps`` derivation (the
stub of ``flakebot_magic.sandbox.stub`` under a name of no crate): nix builds it once, for the first; the
second's build compiles only its own crate. ``verify`` still rebuilds the second bit for bit. A push carries
the dependencies' output, and a teammate (a second nix store) building the second tool against the team's
cache fetches it instead of building it.
"""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from tinycrates import crate, write_registry

import flakebot_magic
from flakebot_magic.backends.nix_cache import deps_output
from flakebot_magic.backends.nix_command import Nix
from flakebot_magic.cli import main as cli_main
from flakebot_magic.config import Settings
from flakebot_magic.host.process import ProcessRunner
from flakebot_magic.manage.verify import verify
from flakebot_magic.records.inventory import Inventory
from flakebot_magic.testing.overlay import overlay_registry

pytestmark = [pytest.mark.nix, pytest.mark.cargo, pytest.mark.timeout(1800)]

NIX = shutil.which("nix") or "nix"
STAND_IN = Path(__file__).resolve().parents[1] / "nixpkgs"
TEAM_CACHE = Path(__file__).resolve().parents[2] / "scripts" / "team-cache.sh"
SYSTEM = f"{platform.machine()}-linux"


#: a feature of this run's: the stub (and so the dependencies' derivation) is new to the store each run
RUN = uuid.uuid4().hex[:12]


def _tool(name: str, said: str) -> object:
    manifest = (
        f'[package]\nname = "{name}"\nversion = "0.1.0"\nedition = "2021"\nlicense = "MIT"\ndescription = "t"\n'
        f'[dependencies]\nmemchr = "2"\n[features]\nrun-{RUN} = []\n'
    )
    main = f'fn main() {{\n    println!("{said} {{:?}}", memchr::memchr(b\'d\', b"shared"));\n}}\n'
    return crate(name, "0.1.0", manifest=manifest, files={"src/main.rs": main})


class Built:
    """Two tools with the same dependencies, built one after the other with the nix backend."""

    def __init__(self, root: Path) -> None:
        self.root = root
        # the tools beside Debian's crates (the stand-in builds against those): both ask for memchr, and only that
        mine = write_registry(root / "mine", [_tool("first-tool", "first"), _tool("second-tool", "second")])
        registry = overlay_registry(root / "registry", sorted(mine.iterdir()))
        self.settings = Settings(
            cache_dir=root / "alice", registry=str(registry), backend="nix", nixpkgs=f"path:{STAND_IN}"
        )
        self.first: Any = self.build("first-tool", "first")
        self.second: Any = self.build("second-tool", "second")

    def build(self, crate_name: str, name: str) -> Any:
        options = {
            "registry": self.settings.registry,
            "backend": "nix",
            "nixpkgs": self.settings.nixpkgs,
            "embedding_model": "off",  # the overlay of Debian's registry indexed by words only: in a second
        }
        return flakebot_magic.build(crate=crate_name, name=name, cache_dir=self.settings.cache_dir, **options)

    def log(self, name: str) -> str:
        return (self.settings.cache.logs / f"{name}.log").read_text()

    def manifest(self, name: str) -> dict[str, Any]:
        record = Inventory(self.settings.cache.tools).get(name)
        assert record is not None
        return dict(json.loads((Path(record.store_path) / "manifest.json").read_text()))


@pytest.fixture(scope="module")
def built(nix_ready: None, tmp_path_factory: pytest.TempPathFactory) -> Built:
    return Built(tmp_path_factory.mktemp("nixdeps"))


def _nix(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [NIX, "--extra-experimental-features", "nix-command flakes", *args], capture_output=True, text=True, timeout=900
    )


def _deps_drv(manifest: dict[str, Any]) -> str:
    shown = json.loads(_nix("show-derivation", manifest["derivation"]).stdout)
    inputs = next(iter(shown.values()))["inputDrvs"]
    found = [d for d in inputs if d.endswith("-flakebot-deps-0.0.0.drv")]
    assert len(found) == 1, inputs
    return str(found[0])


def test_two_tools_with_the_same_dependencies_build_them_once(built: Built) -> None:
    assert built.first().strip() == "first Some(5)" and built.second().strip() == "second Some(5)"
    assert _deps_drv(built.manifest("first")) == _deps_drv(built.manifest("second")), "one derivation for both"
    building = "-flakebot-deps-0.0.0.drv'..."
    assert building in built.log("first"), "the first tool built the dependencies (new to the store this run)"
    assert building not in built.log("second"), "the second tool built the dependencies again"
    assert "Compiling memchr" not in "\n".join(
        line for line in built.log("second").splitlines() if "second-tool>" in line
    ), "the second tool's own derivation compiled its dependency"


def test_verify_still_rebuilds_bit_for_bit(built: Built) -> None:
    assert verify(built.settings, "second").identical


def test_a_teammate_substitutes_the_dependencies_from_the_cache(built: Built) -> None:
    team = built.root / "team"
    done = subprocess.run(
        ["bash", str(TEAM_CACHE), str(team), "deps-test-1"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    cache = f"file://{team / 'cache'}"
    argv = [
        "push",
        "first",
        "--cache-dir",
        str(built.settings.cache_dir),
        "--to",
        cache,
        "--secret-key",
        str(team / "secret-key"),
    ]
    assert cli_main(argv) == 0
    deps = deps_output(Nix(ProcessRunner()), built.manifest("first")["derivation"])
    assert deps, "the first tool's dependencies' output is in this store"
    assert _nix("path-info", "--store", cache, deps).returncode == 0, "the push carried the dependencies' output"
    # the teammate: a store of its own, the team's cache as its substituter; what would building the second do?
    workspace = built.settings.cache.workspaces / "second"
    mate = f"local?root={built.root / 'mate-store'}"
    public = (team / "public-key").read_text().strip()
    planned = _nix(
        "build", "--dry-run", "--store", mate, "--option", "substituters", cache,
        "--option", "trusted-public-keys", public, "--override-input", "nixpkgs", f"path:{STAND_IN}",
        f"path:{workspace}#packages.{SYSTEM}.default",
    )  # fmt: skip
    assert planned.returncode == 0, planned.stderr[-2000:]
    fetched, built_there = _plan(planned.stderr)
    assert deps in fetched, f"the teammate would not fetch the dependencies: {planned.stderr[-2000:]}"
    assert not [d for d in built_there if d.endswith("-flakebot-deps-0.0.0.drv")]
    assert [d for d in built_there if "second-tool" in d], "the second tool itself is the teammate's to build"


def _plan(said: str) -> tuple[list[str], list[str]]:
    """What ``nix build --dry-run`` says it would fetch and build."""
    fetched: list[str] = []
    building: list[str] = []
    current: list[str] | None = None
    for line in said.splitlines():
        if "will be fetched" in line:
            current = fetched
        elif "will be built" in line:
            current = building
        elif line.startswith("  /nix/store/") and current is not None:
            current.append(line.strip())
        else:
            current = None
    return fetched, building
