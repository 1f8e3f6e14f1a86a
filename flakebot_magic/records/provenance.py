"""Where a tool came from (crate, checksum, commit, store path, flake lock, model) and what flakebot changed.

The provenance goes into the cell's output metadata (``metadata.flakebot``
of the ``%%flakebot`` cell's result), so a notebook records which tool it got
and a re-run elsewhere can compare: :func:`differences` says what differs.
The diff is ``git diff published..COMMIT`` in the tool's workspace: what
flakebot changed against the crate as published. Its lines are the model's
and the crate's text, shown through :func:`flakebot_magic.untrusted.safe_html`:
a bidirectional override in the code (Trojan Source) shows as ``�`` where it
would reorder what the reviewer reads.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import FlakebotError, StorageError
from ..host.git import Git
from ..host.process import ProcessRunner
from ..host.storage import read_cache_file
from ..untrusted import safe_html, safe_text

__all__ = [
    "IDENTITY",
    "WorkspaceDiff",
    "describe_locked",
    "differences",
    "provenance_of",
    "render_text",
    "shown_fields",
    "verification_text",
    "workspace_diff",
]

#: the fields that say "the same tool": equal in all of them, the same binary was built from the same source
IDENTITY = ("crate", "version", "checksum", "commit", "source_hash", "flake_lock")

#: files flakebot generates: their diff is hidden when it is long (the stat still lists them)
GENERATED = ("Cargo.lock", "flake.lock", "flake.nix")
#: how many lines of a generated file's diff are still shown
GENERATED_SHOWN = 40
#: the published source's branch in every workspace (see stages/fork.py)
PUBLISHED = "published"


def _first(mapping: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        value = mapping.get(key)
        if value not in (None, ""):
            return value
    return None


def _flake_lock_hash(workspace: Path | None) -> str:
    if workspace is None:
        return ""
    try:
        data = read_cache_file(workspace / "flake.lock")
    except (OSError, StorageError):
        return ""
    return "sha256-" + hashlib.sha256(data).hexdigest()


def provenance_of(tool: Any, record: Any = None) -> dict[str, Any]:
    """The provenance of a deployed tool, as JSON-able data.

    ``tool`` is a :class:`~flakebot_magic.clients.base.ToolClient` (or anything with
    its attributes); ``record`` an optional
    :class:`~flakebot_magic.records.inventory.ToolRecord` that adds the workspace and
    the request.
    """
    manifest: Mapping[str, Any] = getattr(tool, "provenance", None) or {}
    workspace_path: str = getattr(record, "workspace", "") if record is not None else ""
    workspace = Path(workspace_path) if workspace_path else None
    extra: Mapping[str, Any] = getattr(record, "extra", None) or {}
    data: dict[str, Any] = {
        "name": getattr(tool, "name", ""),
        "crate": _first(manifest, "crate") or getattr(tool, "crate", ""),
        "version": _first(manifest, "version") or getattr(tool, "version", ""),
        "checksum": _first(manifest, "checksum") or getattr(tool, "checksum", ""),
        "checksum_kind": _first(manifest, "checksum_kind") or "",
        "registry": _first(manifest, "registry") or "",
        "commit": _first(manifest, "commit") or getattr(record, "commit", "") or "",
        "source_hash": getattr(tool, "source_hash", "") or _first(manifest, "hash") or "",
        "store_path": str(getattr(tool, "store_path", "") or ""),
        "flake_lock": _first(manifest, "flake_lock_hash", "lock_hash", "flake_lock") or _flake_lock_hash(workspace),
        "nix_store_path": _first(manifest, "nix_store_path", "out_path", "nix_out") or "",
        # what a teammate's pull pins: the tool's and its proof's NAR hashes (nix backend)
        "nar_hash": _first(manifest, "nar_hash") or "",
        "proof_store_path": _first(manifest, "proof_store_path") or "",
        "proof_nar_hash": _first(manifest, "proof_nar_hash") or "",
        "backend": getattr(tool, "backend", "") or _first(manifest, "backend") or "cargo",
        "model": _first(manifest, "model") or getattr(record, "model", "") or _first(extra, "model"),
        "iterations": int(
            _first(manifest, "iterations") or getattr(record, "iterations", 0) or _first(extra, "iterations") or 0
        ),
        "rustc": (_first(manifest, "rustc") or "").splitlines()[0] if _first(manifest, "rustc") else "",
    }
    for key in ("substituted_from", "signed_by"):  # a pulled tool: the cache and the key that signed it
        if _first(manifest, key):
            data[key] = _first(manifest, key)
    verified = extra.get("verified")
    if isinstance(verified, Mapping):  # `flakebot verify NAME`: the last rebuild's answer
        data["verified"] = verification_text(verified)
    choice = _first(manifest, "choice") or _first(extra, "choice")
    if isinstance(choice, Mapping):  # who chose the crate and why (stages/choose.py)
        data["choice"] = f"{choice.get('crate', '')} (chosen by {choice.get('by', '')}): {choice.get('reason', '')}"
    data["request"] = str(_first(manifest, "request") or "")  # what the cell asked: a saved notebook's pin is for it
    if record is not None:
        data["workspace"] = getattr(record, "workspace", "")
        data["request"] = getattr(record, "request", "")
        # an agent-requested build names its agent (an MCP client, or "notebook")
        data["requested_by"] = getattr(record, "requested_by", "") or ""
    return data


def verification_text(verified: Mapping[str, Any]) -> str:
    """What ``flakebot verify`` found, in words: bit-identical or not, when, rebuilt from what, nix's words.

    >>> print(verification_text({"identical": False, "at": 0, "path": "/nix/store/x-t", "nar_hash": "sha256-A",
    ...     "rebuilt_from": "/nix/store/y-t.drv", "message": "output '/nix/store/x-t' differs"}))
    NOT bit-identical to /nix/store/x-t (sha256-A): rebuilt 1970-01-01 00:00 UTC from /nix/store/y-t.drv
    nix: output '/nix/store/x-t' differs
    """
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(float(verified.get("at") or 0)))
    same = "bit-identical to" if verified.get("identical") else "NOT bit-identical to"
    text = f"{same} {verified.get('path', '')} ({verified.get('nar_hash', '')}): rebuilt {when}"
    if verified.get("rebuilt_from"):
        text += f" from {verified['rebuilt_from']}"
    if verified.get("message"):
        text += f"\nnix: {verified['message']}"
    return text


def describe_locked(node: Mapping[str, Any]) -> str:
    """``github:NixOS/nixpkgs/abc1234`` or ``path:/x (sha256-…)``: what a flake.lock node pins nixpkgs to.

    Examples
    --------
    >>> describe_locked({"type": "github", "owner": "NixOS", "repo": "nixpkgs", "rev": "0123456789abcdef"})
    'github:NixOS/nixpkgs/0123456789ab'
    """
    kind = node.get("type", "")
    if kind == "path":
        return f"path:{node.get('path', '')} ({str(node.get('narHash', ''))[:19]}…)"
    if kind in ("github", "gitlab", "sourcehut"):
        return f"{kind}:{node.get('owner', '')}/{node.get('repo', '')}/{str(node.get('rev', ''))[:12]}"
    if node.get("rev"):
        return f"{kind}:{node.get('url', '')}@{str(node['rev'])[:12]}"
    return f"{kind}:{node.get('url') or node.get('path') or ''}"


def differences(expected: Mapping[str, Any], actual: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The identity fields in which two provenances differ: ``{}`` means the same tool.

    Examples
    --------
    >>> differences({"crate": "a", "version": "1"}, {"crate": "a", "version": "2"})
    {'version': ('1', '2')}
    """
    return {
        key: (expected.get(key), actual.get(key))
        for key in IDENTITY
        if key in expected and key in actual and expected.get(key) != actual.get(key)
    }


def shown_fields(data: Mapping[str, Any]) -> dict[str, str]:
    """The fields of provenance a person is shown (``show``, the dashboard): those with a value, as text made
    safe to show. A list is its items, comma-separated; a mapping its ``key: value`` pairs.

    >>> shown_fields({"crate": "md", "flake_lock": "", "model": None, "binaries": ["md", "md-cli"], "iterations": 0})
    {'crate': 'md', 'binaries': 'md, md-cli', 'iterations': '0'}
    """
    shown = {}
    for key, value in data.items():
        text = _as_text(value)
        if text.strip():
            shown[safe_text(str(key))] = safe_text(text).strip()
    return shown


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, Mapping):
        return "; ".join(f"{key}: {_as_text(item)}" for key, item in value.items() if _as_text(item).strip())
    if isinstance(value, list | tuple):
        return ", ".join(_as_text(item) for item in value if _as_text(item).strip())
    return str(value)


def render_text(data: Mapping[str, Any]) -> str:
    """Provenance as aligned ``key  value`` lines, for ``%flakebot show``.

    A field with no value (a cargo build's ``flake_lock``, a model-less
    build's ``model``) is left out; a value of several lines (a request)
    goes on under its first, never as a line of its own.

    >>> print(render_text({"crate": "md", "flake_lock": "", "request": "Render it.\\nAs HTML.\\n"}))
    crate    md
    request  Render it.
             As HTML.
    """
    shown = shown_fields(data)
    width = max((len(k) for k in shown), default=0)
    lines = []
    for key, value in shown.items():
        first, *rest = value.splitlines()
        lines.append(f"{key:<{width}}  {first}")
        lines += [f"{'':<{width}}  {line}".rstrip() for line in rest]
    return "\n".join(lines)


@dataclass
class WorkspaceDiff:
    """``git diff published..COMMIT`` in a workspace, with long generated files left out of the body."""

    workspace: Path
    base: str
    commit: str
    stat: str
    body: str
    files: int = 0
    insertions: int = 0
    deletions: int = 0
    hidden: list[str] = field(default_factory=list)

    @property
    def against(self) -> str:
        """What the diff is against: the published crate, or an earlier version of the tool (a commit)."""
        return "the published crate" if self.base == PUBLISHED else f"the previous version ({self.base[:12]})"

    @property
    def summary(self) -> str:
        if not self.files:
            return f"no changes against {self.against}"
        files = f"{self.files} file{'' if self.files == 1 else 's'}"
        return f"{files} changed, +{self.insertions} -{self.deletions} against {self.against}"

    def to_html(self) -> str:
        """The diff with added lines green and removed lines red (inline styles: no CSS needed)."""
        rows = []
        for line in self.body.splitlines():
            escaped = safe_html(line)
            if line.startswith(("+++", "---")):
                style = "font-weight:bold"
            elif line.startswith("+"):
                style = "color:#116329;background:#dafbe1"
            elif line.startswith("-"):
                style = "color:#82071e;background:#ffebe9"
            elif line.startswith("@@"):
                style = "color:var(--jp-brand-color1,#0550ae)"  # the theme's blue: readable on a dark one too
            elif line.startswith("diff --git"):
                style = "font-weight:bold"
            else:
                style = ""
            rows.append(f"<span style='{style}'>{escaped}</span>" if style else escaped)
        notes = "".join(
            f"<div><i>{safe_html(path)}: generated, {GENERATED_SHOWN}+ changed lines hidden "
            f"(<code>git -C {safe_html(str(self.workspace))} diff {self.base}..{self.commit[:12]} -- {safe_html(path)}</code>)</i></div>"
            for path in self.hidden
        )
        return (
            f"<div class='flakebot-diff'><pre style='margin:0 0 4px 0'>{safe_html(self.stat)}</pre>{notes}"
            "<pre style='font-size:12px;line-height:1.35;max-height:480px;overflow:auto;margin:0'>"
            + "\n".join(rows)
            + "</pre></div>"
        )


def workspace_diff(
    workspace: Path, commit: str = "HEAD", *, base: str = PUBLISHED, runner: ProcessRunner | None = None
) -> WorkspaceDiff | None:
    """What flakebot changed in ``workspace`` against ``base`` (the published crate, or a commit of an earlier
    version); None without a workspace or without ``base`` in its history.
    """
    if not (workspace / ".git").exists() or not (base == PUBLISHED or re.fullmatch(r"[0-9a-f]{7,64}", base)):
        return None
    git = Git(workspace, runner or ProcessRunner())
    try:
        if not git("rev-parse", "--verify", "--quiet", f"{base}^{{commit}}", check=False):
            return None
        target = commit or "HEAD"
        if not git("rev-parse", "--verify", "--quiet", f"{target}^{{commit}}", check=False):
            target = "HEAD"
        numstat = git("diff", "--numstat", f"{base}..{target}")
        # git pads every stat line with one space; the runner strips the first
        stat = " " + git("diff", "--stat=100", f"{base}..{target}")
        files = insertions = deletions = 0
        hidden: list[str] = []
        for line in numstat.splitlines():
            added, removed, path = ([*line.split("\t", 2), "", ""])[:3]
            files += 1
            insertions += int(added) if added.isdigit() else 0
            deletions += int(removed) if removed.isdigit() else 0
            changed = (int(added) if added.isdigit() else 0) + (int(removed) if removed.isdigit() else 0)
            if Path(path).name in GENERATED and changed > GENERATED_SHOWN:
                hidden.append(path)
        excludes = [f":(exclude){path}" for path in hidden]
        body = git("diff", f"{base}..{target}", "--", ".", *excludes)
        head = git("rev-parse", target)
    except FlakebotError:
        return None
    return WorkspaceDiff(workspace, base, head, stat, body, files, insertions, deletions, hidden)
