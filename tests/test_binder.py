"""The Binder files: apt.txt agrees with the offline registry list; postBuild installs and enables the extension."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import tomlkit

ROOT = Path(__file__).resolve().parent.parent
BINDER = ROOT / "binder"


def _apt() -> list[str]:
    return [
        line.strip()
        for line in (BINDER / "apt.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]


def test_apt_txt_is_generated_from_the_registry_list() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "binder_apt.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_apt_txt_has_the_toolchain_and_every_registry_package() -> None:
    apt = _apt()
    for package in ("cargo", "rustc", "git", "bubblewrap"):
        assert package in apt
    registry = [
        line.split("#", 1)[0].strip()
        for line in (ROOT / "deps" / "registry-packages.txt").read_text().splitlines()
        if line.split("#", 1)[0].strip()
    ]
    assert registry and set(registry) <= set(apt)
    assert len(apt) == len(set(apt))


def test_post_build_installs_the_package_and_enables_the_extension() -> None:
    post_build = BINDER / "postBuild"
    assert post_build.stat().st_mode & 0o111, "postBuild must be executable"
    assert subprocess.run(["bash", "-n", str(post_build)]).returncode == 0
    text = post_build.read_text()
    assert "pip install" in text and "jupyter server extension enable" in text and "flakebot_magic.server" in text
    assert "jupyterlab" in (BINDER / "requirements.txt").read_text()


def test_the_package_enables_its_server_extension() -> None:
    config = ROOT / "jupyter-config" / "jupyter_server_config.d" / "flakebot_magic.json"
    assert json.loads(config.read_text()) == {"ServerApp": {"jpserver_extensions": {"flakebot_magic.server": True}}}
    pyproject = tomlkit.parse((ROOT / "pyproject.toml").read_text()).unwrap()
    shared = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["shared-data"]
    assert shared[str(config.relative_to(ROOT))] == "etc/jupyter/jupyter_server_config.d/flakebot_magic.json"
