"""Cache-damage attacks (claim 2): one golden cache with two tools, copied per attack, damaged, then the next commands run."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from common import PY, WORK, _manifest, crate, fb, registry

GOLD = WORK / "gold"
REV_MAIN = 'fn main() { println!("I-AM-REV"); }\n'


def golden() -> tuple[Path, Path]:
    cache, reg = GOLD / "cache", GOLD / "registry"
    if (GOLD / "ok").exists():
        return cache, reg
    shutil.rmtree(GOLD, ignore_errors=True)
    reg = registry("gold", ["tinyecho", crate("tinyrev", manifest=_manifest("tinyrev", "0.1.0", '[[bin]]\nname = "tinyrev"\npath = "src/main.rs"\n', description="prints I-AM-REV"),
                                               files={"src/main.rs": REV_MAIN})])
    for name, c in (("echo", "tinyecho"), ("rev", "tinyrev")):
        r = fb(cache, "build", "-r", str(reg), "--crate", c, "--name", name, "-q", f"{name} tool")
        assert r.returncode == 0, r.stderr
    (GOLD / "ok").touch()
    return cache, reg


def fresh(attack: str) -> tuple[Path, Path]:
    cache, reg = golden()
    dest = WORK / "dmg" / attack
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    subprocess.run(["cp", "-a", str(cache), str(dest / "cache")], check=True)
    return dest / "cache", reg


def call(cache: Path, name: str, timeout: int = 60) -> subprocess.CompletedProcess[str]:
    """Load the tool from Python as a user would after a restart, and call it with stdin 'hi'."""
    code = ("import flakebot_magic,sys\n"
            f"t=flakebot_magic.load({name!r}, cache_dir={str(cache)!r})\n"
            "print('OUT:', t('hi'))\n")
    code = ("import flakebot_magic,sys\ntry:\n" + "".join("    " + l + "\n" for l in code.splitlines())
            + "except flakebot_magic.FlakebotError as exc:\n    print('FLAKEBOT-ERROR:', type(exc).__name__, exc, file=sys.stderr); sys.exit(2)\n")
    try:
        return subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=timeout, errors="replace")
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(exc.cmd, -9, "", f"HUNG after {timeout}s")


def entry(cache: Path, crate_name: str) -> Path:
    return next(p for p in (cache / "store").iterdir() if p.name.endswith(f"-{crate_name}-0.2.0") or p.name.endswith(f"-{crate_name}-0.1.0"))


def tb(*results: subprocess.CompletedProcess[str]) -> str:
    for r in results:
        if "Traceback" in (r.stdout + r.stderr):
            return (r.stdout + r.stderr)[-400:]
    return ""
