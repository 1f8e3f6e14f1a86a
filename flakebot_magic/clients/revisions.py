"""MCP's protocol revisions as flakebot speaks them, on both sides: the two eras, the per-request envelope, the errors.

The revision 2026-07-28 (basic/versioning in its specification) splits the
revisions into two eras:

* **legacy**, 2024-11-05 to 2025-11-25 (:data:`HANDSHAKE_VERSIONS`): the
  client opens a session with ``initialize`` (and ``notifications/initialized``);
  the version and the capabilities agreed there hold for the session.
* **modern**, 2026-07-28 (:data:`MODERN_VERSIONS`): stateless. There is no
  handshake and no session; every request carries its protocol version and the
  client's capabilities (and, should, its identity) in ``params._meta``
  (:data:`PROTOCOL_VERSION_KEY` ...). ``server/discover`` says what a server
  supports; ``subscriptions/listen`` opens the one long-lived stream of change
  notifications; every result carries ``resultType``; lists carry cache hints
  (``ttlMs``, ``cacheScope``); ``ping``, ``logging/setLevel`` and
  ``resources/subscribe`` are gone.

Both of flakebot's MCP servers (``flakebot mcp``, the bridge) and its client
of deployed MCP tools read what the eras share from here: the version lists,
the ``_meta`` keys, the three error codes 2026-07-28 defines, and the envelope
check (:func:`read_envelope`), which tells a modern request from a malformed one
in the order the revision gives (the envelope, then the HTTP headers, then the
version).

Examples
--------
>>> read_envelope("tools/list", {"_meta": {PROTOCOL_VERSION_KEY: "2026-07-28", CLIENT_CAPABILITIES_KEY: {}}})
Envelope(version='2026-07-28', client_info={}, capabilities={})
>>> read_envelope("tools/list", {}).code
-32602
>>> read_envelope("tools/list", {"_meta": {PROTOCOL_VERSION_KEY: "1999-01-01", CLIENT_CAPABILITIES_KEY: {}}}).data
{'supported': ['2026-07-28', '2025-11-25', '2025-06-18', '2025-03-26', '2024-11-05'], 'requested': '1999-01-01'}
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .jsonrpc import INVALID_PARAMS

__all__ = [
    "CLIENT_CAPABILITIES_KEY",
    "CLIENT_INFO_KEY",
    "HANDSHAKE_VERSIONS",
    "HEADER_MISMATCH",
    "LATEST_HANDSHAKE",
    "LATEST_MODERN",
    "MISSING_CLIENT_CAPABILITY",
    "MODERN_METHODS",
    "MODERN_VERSIONS",
    "NAME_BEARING",
    "PROTOCOL_VERSION_KEY",
    "REMOVED_METHODS",
    "SERVED_VERSIONS",
    "SERVER_INFO_KEY",
    "SUBSCRIPTION_ID_KEY",
    "UNSUPPORTED_VERSION",
    "Envelope",
    "Refusal",
    "decode_header_value",
    "describe",
    "is_modern",
    "modern_result",
    "negotiate",
    "read_envelope",
    "stateless",
    "unsupported_version",
]

#: the revisions reached through the ``initialize`` handshake, oldest first
HANDSHAKE_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
#: the stateless revisions (a per-request envelope), oldest first
MODERN_VERSIONS = ("2026-07-28",)
LATEST_HANDSHAKE = HANDSHAKE_VERSIONS[-1]
LATEST_MODERN = MODERN_VERSIONS[-1]
#: every revision flakebot speaks, newest first: ``server/discover``'s ``supportedVersions`` and the
#: ``supported`` list of an unsupported-version error (the legacy ones tell a client it may fall back)
SERVED_VERSIONS = (*reversed(MODERN_VERSIONS), *reversed(HANDSHAKE_VERSIONS))

#: the reserved ``_meta`` keys of 2026-07-28 (requests carry the first three, results the server's identity,
#: the notifications of a ``subscriptions/listen`` stream its id)
PROTOCOL_VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
CLIENT_INFO_KEY = "io.modelcontextprotocol/clientInfo"
SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"
SUBSCRIPTION_ID_KEY = "io.modelcontextprotocol/subscriptionId"

#: the error codes 2026-07-28 defines (JSON-RPC's server-error range, its own sub-range)
HEADER_MISMATCH, MISSING_CLIENT_CAPABILITY, UNSUPPORTED_VERSION = -32020, -32021, -32022
#: methods only the stateless era has: an envelope is required of them whatever came before on the connection
MODERN_METHODS = frozenset({"server/discover", "subscriptions/listen"})
#: what 2026-07-28 removed: a stateless request for one is an unknown method (``-32601``)
REMOVED_METHODS = frozenset({"initialize", "ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe"})

#: the methods whose name (tool, prompt) or uri (resource) an HTTP request also carries as ``Mcp-Name``
NAME_BEARING = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}


@dataclass(frozen=True)
class Envelope:
    """A modern request's envelope, checked: its revision, and the client's identity and capabilities."""

    version: str
    client_info: dict[str, Any] = field(default_factory=dict)
    capabilities: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused, as a JSON-RPC error's fields (``data`` is left out when None)."""

    code: int
    message: str
    data: Any = None


def describe(version: str) -> str:
    """A revision in words: ``2026-07-28 (stateless)``, ``2025-06-18 (initialize handshake)``."""
    if version in MODERN_VERSIONS:
        return f"{version} (stateless)"
    if version in HANDSHAKE_VERSIONS:
        return f"{version} (initialize handshake)"
    return version or "(not started)"


def is_modern(params: Any) -> bool:
    """Whether a request's params carry the modern envelope's version key (legacy traffic never does:
    its ``_meta`` holds at most a ``progressToken``); a half-built envelope counts, to be refused by
    :func:`read_envelope` with what it lacks."""
    meta = params.get("_meta") if isinstance(params, Mapping) else None
    return isinstance(meta, Mapping) and PROTOCOL_VERSION_KEY in meta


def stateless(method: str, params: Any) -> bool:
    """The era of a request on a connection that does not say it otherwise (stdio): stateless when it carries the
    envelope or is a method only 2026-07-28 has; ``initialize`` and a request with neither are the handshake era's
    (as before 2026-07-28, a server answers them whether or not ``initialize`` came first)."""
    return method != "initialize" and (is_modern(params) or method in MODERN_METHODS)


def negotiate(asked: Any) -> str:
    """The revision to answer ``initialize`` with: the client's when a handshake revision, else the newest one (a
    client that proposes 2026-07-28 in ``initialize`` gets 2025-11-25: the handshake is the legacy era's)."""
    return asked if asked in HANDSHAKE_VERSIONS else LATEST_HANDSHAKE


def unsupported_version(requested: str) -> Refusal:
    """The error for a request at a revision flakebot does not serve: ``data`` names the ones it does."""
    return Refusal(
        UNSUPPORTED_VERSION,
        "Unsupported protocol version",
        {"supported": list(SERVED_VERSIONS), "requested": requested},
    )


_SENTINEL = re.compile(r"=\?base64\?([^?]*)\?=")


def decode_header_value(value: str | None) -> str | None:
    """An ``Mcp-Name`` (or ``Mcp-Param-*``) value as sent: ``=?base64?...?=`` decoded (None when that is not
    canonical base64 of UTF-8, so a mangled header never matches), anything else as it is."""
    if value is None:
        return None
    found = _SENTINEL.fullmatch(value)
    if found is None:
        return value
    try:
        raw = base64.b64decode(found.group(1), validate=True)
        if base64.b64encode(raw).decode("ascii") != found.group(1):
            return None
        return raw.decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


def read_envelope(method: str, params: Any, headers: Mapping[str, str | None] | None = None) -> Envelope | Refusal:
    """A modern request's envelope, or why the request is refused, checked in the revision's order.

    1. ``params._meta`` is an object holding the protocol version and the
       client's capabilities (the client's identity is optional): else
       ``-32602`` naming what is missing.
    2. Over HTTP (``headers``, keyed by lower-case name, values with the
       spaces around them stripped): ``MCP-Protocol-Version`` equals the
       envelope's version, ``Mcp-Method`` the method, ``Mcp-Name`` (decoded)
       the tool's name or the resource's uri: else ``-32020``, before the
       version is judged (a client that contradicts itself is told so).
    3. The version is a string (``-32602``) that flakebot serves statelessly:
       else ``-32022`` with the revisions it serves (:func:`unsupported_version`).
    """
    meta = params.get("_meta") if isinstance(params, Mapping) else None
    if not isinstance(meta, Mapping):
        return Refusal(
            INVALID_PARAMS,
            f"Invalid params: params._meta must be an object carrying {PROTOCOL_VERSION_KEY!r} and "
            f"{CLIENT_CAPABILITIES_KEY!r} (protocol 2026-07-28), or send initialize first (2025-11-25 and older)",
        )
    missing = [key for key in (PROTOCOL_VERSION_KEY, CLIENT_CAPABILITIES_KEY) if key not in meta]
    if missing:
        return Refusal(INVALID_PARAMS, f"Invalid params: params._meta lacks {' and '.join(missing)}")
    version = meta[PROTOCOL_VERSION_KEY]
    if headers is not None:
        if headers.get("mcp-protocol-version") is None or headers.get("mcp-protocol-version") != version:
            return Refusal(HEADER_MISMATCH, "Header mismatch: MCP-Protocol-Version does not match the request's _meta")
        if headers.get("mcp-method") != method:
            return Refusal(HEADER_MISMATCH, "Header mismatch: Mcp-Method does not match the request's method")
        key = NAME_BEARING.get(method)
        named = params.get(key) if key is not None else None
        if named is not None and decode_header_value(headers.get("mcp-name")) != named:
            return Refusal(HEADER_MISMATCH, f"Header mismatch: Mcp-Name does not match the request's params.{key}")
    if not isinstance(version, str):
        return Refusal(INVALID_PARAMS, f"Invalid params: {PROTOCOL_VERSION_KEY} must be a string")
    if version not in MODERN_VERSIONS:
        return unsupported_version(version)
    info, capabilities = meta.get(CLIENT_INFO_KEY), meta[CLIENT_CAPABILITIES_KEY]
    if not isinstance(capabilities, Mapping):
        return Refusal(INVALID_PARAMS, f"Invalid params: {CLIENT_CAPABILITIES_KEY} must be an object")
    return Envelope(version, dict(info) if isinstance(info, Mapping) else {}, dict(capabilities))


def modern_result(
    result: Mapping[str, Any], server_info: Mapping[str, Any], *, ttl_ms: int | None = None
) -> dict[str, Any]:
    """``result`` as a 2026-07-28 result: ``resultType: complete``, the server's identity in ``_meta``, and for a
    cacheable one (``ttl_ms`` given) the cache hints (``cacheScope`` private: the list is this user's tools)."""
    out = dict(result)
    out["resultType"] = "complete"
    out["_meta"] = {**(out.get("_meta") or {}), SERVER_INFO_KEY: dict(server_info)}
    if ttl_ms is not None:
        out["ttlMs"] = max(0, int(ttl_ms))
        out["cacheScope"] = "private"
    return out
