"""Defaults an install wrote for this Python environment: ``<sys.prefix>/etc/flakebot/defaults.json``.

``make demo`` builds against the nixpkgs it was given (``FLAKEBOT_NIXPKGS``; the
test stand-in by default). A JupyterLab the user starts afterwards does not
have that variable, and a build there would fall back to cargo with a warning.
So the install writes what it chose here, and :meth:`flakebot_magic.options.Option.default_value`
reads it after the environment: the variable still wins, then this file, then
the built-in default. Only options' environment variables are read from it.

>>> import tempfile, pathlib
>>> prefix = pathlib.Path(tempfile.mkdtemp())
>>> write({"FLAKEBOT_NIXPKGS": "path:/n"}, prefix=prefix)
>>> installed("FLAKEBOT_NIXPKGS", prefix=prefix), installed("FLAKEBOT_MODEL", prefix=prefix)
('path:/n', None)
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from .fsutil import load_json, read_regular

__all__ = ["defaults_file", "installed", "write"]


def defaults_file(prefix: Path | None = None) -> Path:
    """The file, in the environment this Python runs in (a venv's, or the system's)."""
    return Path(prefix if prefix is not None else sys.prefix) / "etc" / "flakebot" / "defaults.json"


@functools.lru_cache(maxsize=4)
def _read(path: Path, stamp: tuple[int, int]) -> dict[str, str]:
    try:
        data = load_json(read_regular(path, 64 * 1024)[0].decode("utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def installed(variable: str, *, prefix: Path | None = None) -> str | None:
    """The value the install wrote for the environment variable ``variable``, or None."""
    path = defaults_file(prefix)
    try:
        info = path.stat()
    except OSError:
        return None
    return _read(path, (info.st_mtime_ns, info.st_size)).get(variable) or None


def write(values: Mapping[str, str], *, prefix: Path | None = None) -> None:
    """Merge ``values`` (environment variable names and values) into the file; an empty value removes one."""
    path = defaults_file(prefix)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        info = path.stat()
        current = _read(path, (info.st_mtime_ns, info.st_size))
    except OSError:
        current = {}
    merged = {**(current if isinstance(current, dict) else {}), **values}
    merged = {k: v for k, v in merged.items() if v}
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
