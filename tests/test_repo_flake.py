"""The repository's own flake.nix: checks, package, devShell and ``nix run .#lab`` (marked ``nix``).

Evaluated against the nixpkgs stand-in in tests/nixpkgs, whose Python parts
run this test's Python (``FLAKEBOT_HOST_PYTHON``): the virtualenv that has
the package's dependencies.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flakebot_magic.backends.nix_command import NIX_FEATURES

REPO = Path(__file__).resolve().parents[1]
NIX = shutil.which("nix")
OVERRIDE = ["--override-input", "nixpkgs", f"path:{REPO / 'tests' / 'nixpkgs'}"]

pytestmark = [
    pytest.mark.nix,
    pytest.mark.skipif(NIX is None, reason="nix is not installed (run scripts/setup-nix.sh as root)"),
]


def _nix(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    assert NIX is not None
    env = {**os.environ, "FLAKEBOT_HOST_PYTHON": sys.executable}
    done = subprocess.run(
        [NIX, *NIX_FEATURES, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"nix {' '.join(args)} failed:\n{done.stderr[-4000:]}"
    return done


def _built(attribute: str) -> Path:
    done = _nix("build", *OVERRIDE, "--no-link", "--json", f".#{attribute}")
    return Path(json.loads(done.stdout)[0]["outputs"]["out"])


def test_the_repository_flake_checks() -> None:
    _nix("flake", "check", *OVERRIDE)


def test_the_package_has_the_flakebot_command() -> None:
    package = _built("default")
    # the stand-in's python3 is the host's (tests/nixpkgs/python.sh): point it at the one with the dependencies
    env = {**os.environ, "FLAKEBOT_HOST_PYTHON": sys.executable}
    done = subprocess.run(
        [str(package / "bin" / "flakebot"), "--help"], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0 and "usage: flakebot" in done.stdout
    assert (package / "lib" / "python3" / "site-packages" / "flakebot_magic" / "__init__.py").is_file()


def test_the_dev_shell_has_python_rust_and_nix() -> None:
    script = (
        "python3 -c 'import IPython, traitlets, httpx, pytest' && cargo --version && rustc --version && nix --version"
    )
    done = _nix("develop", *OVERRIDE, "-c", "sh", "-c", script)
    assert "cargo " in done.stdout and "rustc " in done.stdout and "nix (Nix)" in done.stdout


@pytest.mark.skipif(importlib.util.find_spec("jupyterlab") is None, reason="jupyterlab is not installed in this venv")
def test_nix_run_lab_starts_jupyterlab_with_the_magic() -> None:
    done = _nix("run", *OVERRIDE, ".#lab", "--", "--version")
    assert done.stdout.strip()[:1].isdigit(), done.stdout
    lab = _built("lab")
    script = (lab / "bin" / "flakebot-lab").read_text()
    kernel_dir = script.split('JUPYTER_PATH="', 1)[1].split("/share/jupyter", 1)[0]
    spec = json.loads((Path(kernel_dir) / "share" / "jupyter" / "kernels" / "flakebot" / "kernel.json").read_text())
    assert "--ext=flakebot_magic" in spec["argv"]
    assert "default_kernel_name=flakebot" in script
