"""The system prompt of an edit session: the request, the tool contract, the rules, a README summary, a repo map."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..host.git import Git
from ..host.trees import Walk
from ..registry.base import CrateCandidate
from ..sandbox.layout import source_dirs
from ..untrusted import safe_text
from .files import line_count, read_text
from .ratchet import blank

__all__ = ["PromptContext", "readme_summary", "repo_map", "system_prompt"]

_CONTRACT = (
    "The tool contract (checked by code): Cargo.toml must contain\n"
    "[package.metadata.flakebot]\n"
    'kind = "cli"    # one of "cli", "mcp", "http"; "cli" unless an MCP server or HTTP service is asked for\n'
    'bin = "NAME"    # the binary target to deploy; it must exist and build\n'
    "A cli tool takes its input from arguments or standard input and prints its result to standard "
    "output. Its --help must exit 0 and describe the usage; if it reads standard input, its help "
    'must say "standard input".\n'
    "An mcp tool speaks the Model Context Protocol as JSON-RPC 2.0 over stdio, one JSON message per "
    "line: it answers initialize (protocolVersion 2025-06-18), tools/list (each tool with name, "
    "description and an inputSchema) and tools/call (content, structuredContent for data, "
    "isError: true for a failure); it answers unknown methods with error -32601 and exits when "
    "stdin closes.\n"
    "An http tool is a service that listens on 127.0.0.1 only, at the port given as --port PORT and "
    "in the PORT environment variable; it requires `Authorization: Bearer $FLAKEBOT_TOKEN` on every "
    'request except its health path (GET /health unless the table sets health = "/path"), and '
    "may describe its operations at GET /openapi.json. See docs/tool-contract.md."
)


@dataclass(frozen=True)
class PromptContext:
    """What the system prompt is made of, besides the workspace's files."""

    request: str
    baseline_report: str
    sessions: list[dict[str, Any]]
    follow_up: bool
    crate: CrateCandidate | None
    allow_build_scripts: bool
    max_iterations: int


def system_prompt(root: Path, git: Git, context: PromptContext) -> str:
    """The system prompt for an edit session on the workspace ``root``."""
    crate = context.crate
    parts = [
        "You are the edit loop of flakebot. You turn a Rust crate into a tool that does what the user "
        "asks, by editing the crate's files with the tools you have. You cannot run commands: flakebot "
        "runs `cargo build`, `cargo test` and `cargo clippy` when you call run_checks or finish, "
        "and answers with the compiler's diagnostics and the test results.",
        f"The request: {context.request}",
        _CONTRACT,
        "Rules, enforced by code:\n"
        "- The number of passing tests never goes down; existing tests may not be deleted, emptied or "
        "ignored. A change that does either is reverted to the best commit.\n"
        "- Paths are relative to the crate root. '..', absolute paths, .git/, .cargo/, target/, "
        f"rust-toolchain files{'' if context.allow_build_scripts else ' and build.rs (build scripts)'} are refused.\n"
        f"- Dependencies come from the offline registry {crate.registry if crate else ''} only; there is no network.\n"
        "- Add tests for the new behaviour (unit tests next to the code, or tests/*.rs).\n"
        f"- You have {context.max_iterations} check runs (run_checks or finish) for this session.\n"
        "- When the checks pass and the contract is met, call finish(summary).",
    ]
    if crate is not None:
        parts.append(f"The crate: {crate.name} {crate.version}: {crate.description}")
    readme = readme_summary(root)
    if readme:
        parts.append(f"README (summary):\n{readme}")
    parts.append(f"Files (public items):\n{repo_map(root)}")
    parts.append(f"Cargo.toml:\n{_head_of(root / 'Cargo.toml', 4000)}")
    if context.follow_up and context.sessions:
        history = "\n".join(f"- {s.get('request', '')!r}: {s.get('summary', '')}" for s in context.sessions[-5:])
        log = git("log", "--format=%h %s", "-n", "15")
        parts.append(f"Earlier sessions on this workspace:\n{history}\nRecent commits:\n{log}")
    parts.append(f"The baseline (check run 0, before your edits):\n{context.baseline_report}")
    return "\n\n".join(parts)


def _head_of(path: Path, limit: int) -> str:
    try:
        text = read_text(path, limit * 4 + 1)
    except OSError:
        return "(missing)"
    return text if len(text) <= limit else text[:limit] + "\n... (cut)"


def readme_summary(root: Path, limit: int = 1500) -> str:
    """The crate's README without badges, images, HTML comments and link definitions; at most ``limit`` characters."""
    for name in ("README.md", "README", "readme.md", "README.rst", "README.txt"):
        path = root / name
        if path.is_file():
            try:
                text = read_text(path, 1 << 20)
            except OSError:
                continue
            # badges, images, HTML comments and link definitions say nothing about the code
            text = re.sub(r"<!--.*?-->|<img[^>]*>", "", text, flags=re.S)
            text = re.sub(r"!?\[!?\[[^\]]*\](?:\([^)]*\)|\[[^\]]*\])\](?:\([^)]*\)|\[[^\]]*\])", "", text)
            text = re.sub(r"!\[[^\]]*\](?:\([^)]*\)|\[[^\]]*\])", "", text)
            text = re.sub(r"(?m)^\[[^\]]+\]:.*$", "", text)
            text = re.sub(r"\n\s*\n(\s*\n)+", "\n\n", safe_text(text)).strip()
            return text if len(text) <= limit else text[:limit].rsplit("\n", 1)[0] + "\n..."
    return ""


_PUB_ITEM = re.compile(
    r"^\s*pub(?:\([^)]*\))?\s+(?:(?:unsafe|async|const|extern\s+\"C\")\s+)*"
    r"(fn|struct|enum|trait|type|const|static|mod|macro_rules!)\s*([A-Za-z_]\w*)",
    re.M,
)


def repo_map(root: Path, limit: int = 5000) -> str:
    """Files and their public items: the shape of the crate in a few lines."""
    lines: list[str] = []
    for dirpath, dirnames, filenames in Walk(root):  # an explicit stack, never deeper than MAX_DEPTH
        dirnames[:] = sorted(source_dirs(dirnames))
        for filename in sorted(filenames):
            file = Path(dirpath) / filename
            rel = file.relative_to(root).as_posix()
            entry = f"{rel} ({line_count(file)} lines)"
            if filename.endswith(".rs"):
                try:
                    items = _PUB_ITEM.findall(blank(read_text(file)))
                except OSError:
                    items = []
                if items:
                    shown = ", ".join(f"{kind} {name}" for kind, name in items[:12])
                    entry += f": {shown}" + (f", ... ({len(items)} items)" if len(items) > 12 else "")
            lines.append(entry)
    text = "\n".join(lines)
    return text if len(text) <= limit else text[:limit].rsplit("\n", 1)[0] + f"\n... ({len(lines)} files in all)"
