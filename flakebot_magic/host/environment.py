"""What a child process sees of the kernel's environment: variables pass by name, never by looking harmless.

Two rules, both allowlists: :func:`allowed_env` for code flakebot does not
trust (crate code in the sandbox, a deployed tool), :func:`scrubbed_env` for
flakebot's own helpers (git, nix). A denylist lets through whatever secret
nobody thought of (``SECRET_KEY``, ``DATABASE_URL``, ``PGPASSWORD``,
``AZURE_OPENAI_KEY``, ``SSH_AUTH_SOCK`` ...); an allowlist cannot.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["allowed_env", "environ_stamp", "scrubbed_env"]

# a child sees only variables named here (and what flakebot passes explicitly)
_ALLOWED = frozenset({"PATH", "LANG", "LANGUAGE", "TZ", "TERM", "NO_COLOR", "RUST_BACKTRACE", "SOURCE_DATE_EPOCH"})
_ALLOWED_PREFIXES = ("LC_",)
# What flakebot's own trusted helpers (git, nix, nothing the model wrote) also need: where the user's home, toolchain and CA certificates are. Paths, not secrets.
_HOST = frozenset(
    {
        "HOME",
        "USER",
        "LOGNAME",
        "CARGO_HOME",
        "RUSTUP_HOME",
        "RUSTUP_TOOLCHAIN",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "NIX_SSL_CERT_FILE",
        "CURL_CA_BUNDLE",
        "GIT_SSL_CAINFO",
        "XDG_CACHE_HOME",
        "XDG_CONFIG_HOME",
        "XDG_DATA_HOME",
        "XDG_STATE_HOME",
        "NIX_PATH",
        "NIX_REMOTE",
        "NIX_CONF_DIR",
        "NIX_USER_CONF_FILES",
        "NIX_STORE_DIR",
        "NIX_STATE_DIR",
        # ssh's options for nix's remote builders and ssh:// caches (a port, a host key alias): options, no keys
        "NIX_SSHOPTS",
    }
)
# belt and braces: even an allowlisted name is dropped when it reads like a secret
_SECRET = re.compile(r"(KEY|TOKEN|SECRET|PASSW(OR)?D|CREDENTIALS?|AUTH|SOCK|COOKIE|SESSION)", re.I)


@functools.lru_cache(maxsize=4096)
def _allowed(name: str, extra_names: frozenset[str] = frozenset()) -> bool:
    """Whether ``name`` passes (remembered per name: a tool call filters the same names each time)."""
    if _SECRET.search(name):
        return False
    return name in _ALLOWED or name in extra_names or name.startswith(_ALLOWED_PREFIXES)


#: extra names -> (``os.environ`` as it was read, raw; the variables of it that passed): one entry per rule (two)
_PASSED: dict[frozenset[str], tuple[dict[Any, Any], dict[str, str]]] = {}


def _passing(extra_names: frozenset[str]) -> dict[str, str]:
    """The variables of ``os.environ`` that pass (do not change the answer), kept while ``os.environ`` is unchanged.

    Filtering decodes every variable's name (some microseconds a call of a
    tool). What was read is kept with a copy of ``os.environ``'s raw mapping
    (CPython's ``os.environ._data``, the bytes it writes through to); any
    change there (a ``setenv``, a deletion) makes the next call read it again.
    Without that mapping (another Python), it is read every time.
    """
    raw = getattr(os.environ, "_data", None)
    kept = _PASSED.get(extra_names)
    if kept is not None and kept[0] == raw:  # one comparison of two dicts of bytes, in C
        return kept[1]
    seen = dict(raw) if isinstance(raw, dict) else None  # before reading: a change meanwhile is seen next time
    environ = os.environ
    passed = {k: environ[k] for k in environ if _allowed(k, extra_names)}  # only the values that pass are decoded
    if seen is not None:
        _PASSED[extra_names] = (seen, passed)  # one assignment: a thread reads the old pair or the new one
    return passed


def environ_stamp() -> object:
    """An object that stays the same (``is``) while ``os.environ`` is unchanged, and only then.

    What a caller that keeps an environment it made compares (a tool's call:
    :meth:`flakebot_magic.clients.base.ToolClient._environment`).
    """
    return _passing(frozenset())


def allowed_env(extra: Mapping[str, str] | None = None, *, home: str | None = None) -> dict[str, str]:
    """The environment for code flakebot does not trust: allowlisted variables only.

    Passes ``PATH``, ``LANG``, ``LANGUAGE``, ``LC_*``, ``TZ``, ``TERM``,
    ``NO_COLOR``, ``RUST_BACKTRACE`` and ``SOURCE_DATE_EPOCH`` from the current
    environment; nothing else (no API keys, ``SECRET_KEY``, ``DATABASE_URL``,
    ``PGPASSWORD``, ``SSH_AUTH_SOCK``, not even ``HOME``). ``home`` sets
    ``HOME``; ``extra`` is added last, unfiltered: it is what flakebot or the
    user passes on purpose (``CARGO_*``, ``RUSTUP_*``, a tool's ``env=``).

    >>> env = allowed_env({"CARGO_TERM_COLOR": "never"}, home="/tmp/empty-home")
    >>> env["HOME"], "OPENAI_API_KEY" in env
    ('/tmp/empty-home', False)
    """
    env = dict(_passing(frozenset()))
    if home is not None:
        env["HOME"] = home
    if extra:
        env.update(extra)
    return env


def scrubbed_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for flakebot's own helpers (git, nix, cargo outside the sandbox).

    The :func:`allowed_env` rule, plus what those helpers need to find the
    user's home, toolchain, nix and CA certificates (``HOME``, ``USER``,
    ``CARGO_HOME``, ``RUSTUP_HOME``, ``RUSTUP_TOOLCHAIN``, ``SSL_CERT_FILE``,
    ``NIX_PATH``, ``XDG_*_HOME`` ...). Never an API key, token or socket.
    ``extra`` is added last, unfiltered.
    """
    env = dict(_passing(_HOST))
    if extra:
        env.update(extra)
    return env
