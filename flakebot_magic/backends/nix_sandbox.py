"""Does nix build confined here? (:func:`nix_sandbox`), asked of nix itself, kept while nix and nix.conf are the same.

``nix show-config --json`` (``nix config show --json`` in newer nix), with
the environment nix builds get: ``sandbox = true``, and build users when nix
runs as root on a local store. :mod:`.nix_command` re-exports all of it.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, StageTimeout
from ..host.fsutil import load_json
from ..host.probes import ProbeCache, file_identity
from ..host.process import ProcessRunner, scrubbed_env

__all__ = ["NIX_FEATURES", "NixSandbox", "find_nix", "nix_sandbox"]

#: every nix command gets these, whatever nix.conf says
NIX_FEATURES = ("--extra-experimental-features", "nix-command flakes")


def find_nix() -> str | None:
    """The ``nix`` executable on PATH, or None."""
    return shutil.which("nix")


@dataclass(frozen=True)
class NixSandbox:
    """Whether nix builds run confined: in nix's sandbox, and not as root.

    ``why`` says what was found (``sandbox = false``, ``nix show-config
    failed: ...``), for messages.
    """

    on: bool
    why: str


#: environment variables that change which nix.conf nix reads (or what it says)
_CONFIG_ENV = (
    "NIX_CONF_DIR",
    "NIX_CONFIG",
    "NIX_USER_CONF_FILES",
    "XDG_CONFIG_HOME",
    "XDG_CONFIG_DIRS",
    "HOME",
    "NIX_REMOTE",
)
#: nix's answer per executable and configuration, asked again when the executable or a nix.conf changes
_SANDBOX_PROBES: ProbeCache[tuple[str, ...], NixSandbox] = ProbeCache(
    "nix sandbox", 8, failed=lambda state: "cannot tell" in state.why
)


def _nix_conf_files(env: dict[str, str]) -> list[str]:
    """The nix.conf files nix reads with ``env`` (files pulled in by ``include`` are not followed)."""
    files = [os.path.join(env.get("NIX_CONF_DIR") or "/etc/nix", "nix.conf")]
    if env.get("NIX_USER_CONF_FILES"):
        return files + env["NIX_USER_CONF_FILES"].split(":")
    home = env.get("HOME", "")
    config_home = env.get("XDG_CONFIG_HOME") or (os.path.join(home, ".config") if home else "")
    dirs = [config_home, *(env.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(":")]
    return files + [os.path.join(d, "nix", "nix.conf") for d in dirs if d]


def nix_sandbox(
    executable: str | None = None,
    runner: ProcessRunner | None = None,
    *,
    env: dict[str, str] | None = None,
) -> NixSandbox:
    """Does nix build in its sandbox (``sandbox = true``, and build users when nix runs as root)?

    Asks ``nix show-config --json`` (nix 2.8; ``nix config show --json`` in
    newer nix) with the environment nix builds get; the answer is kept per
    executable and nix configuration (``NIX_CONF_DIR``, ``NIX_CONFIG``, ...)
    while the executable and the nix.conf files are unchanged (an answer of
    a nix that could not tell, a short while only). ``sandbox = relaxed``
    counts as off: a derivation may opt out of it. A nix that cannot tell
    counts as off.
    """
    found = executable or find_nix()
    if not found:
        return NixSandbox(False, "nix is not installed")
    env = scrubbed_env() if env is None else env
    key = (found, str(os.geteuid()), *(env.get(name, "") for name in _CONFIG_ENV))
    identity = file_identity([shutil.which(found) or found, *_nix_conf_files(env)])
    return _SANDBOX_PROBES.get(key, identity, lambda: _probe_sandbox(found, runner or ProcessRunner(), env))


def _probe_sandbox(executable: str, runner: ProcessRunner, env: dict[str, str]) -> NixSandbox:
    failed = ""
    for command in (("show-config", "--json"), ("config", "show", "--json")):
        try:
            done = runner.run([executable, *NIX_FEATURES, *command], cwd=Path("/"), env=env, timeout=120.0)
        except (StageTimeout, ConfigError) as exc:
            return NixSandbox(False, f"`nix show-config` did not answer, so it cannot tell: {exc}")
        if done.returncode == 0:
            break
        failed = failed or (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1][:200]
    else:
        return NixSandbox(False, f"`nix show-config` failed, so it cannot tell: {failed}")
    try:
        config = load_json(done.stdout)
        sandbox = config["sandbox"]["value"]
        users = config.get("build-users-group", {}).get("value", "")
        store = str(config.get("store", {}).get("value", "auto"))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return NixSandbox(False, f"`nix show-config --json` printed no sandbox setting ({exc})")
    if sandbox is not True:
        shown = "false" if sandbox is False else str(sandbox)
        return NixSandbox(False, f"nix.conf says `sandbox = {shown}`")
    # nix as root on a local store builds as root unless it has build users
    # (the sandbox's bind mounts are writable to root)
    local = not env.get("NIX_REMOTE") and store in ("auto", "local", "")
    if os.geteuid() == 0 and local and not users:
        return NixSandbox(False, "nix.conf's `build-users-group` is empty, so builds run as root")
    return NixSandbox(True, "sandbox = true")
