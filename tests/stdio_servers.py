"""Scripted stdio MCP servers for the clients' tests: one that answers ``initialize`` and then what a test says.

from stdio_servers import mcp_server
server = mcp_server(tmp_path / "server.py", "print(json.dumps({...}), flush=True)")
"""

from __future__ import annotations

import textwrap
from pathlib import Path

__all__ = ["mcp_server"]


def mcp_server(path: Path, answer: str) -> Path:
    """Write to ``path`` a Python MCP server answering ``initialize`` as a server does and every other request
    (``m``, the decoded message, with an ``id``) with the statements ``answer``; return ``path``."""
    path.write_text(
        "import json, sys\n"
        "for line in sys.stdin:\n"
        "    m = json.loads(line)\n"
        "    if m.get('method') == 'initialize':\n"
        "        r = {'protocolVersion': '2025-06-18', 'capabilities': {}, 'serverInfo': {'name': 's', 'version': '1'}}\n"
        "        print(json.dumps({'jsonrpc': '2.0', 'id': m['id'], 'result': r}), flush=True)\n"
        "    elif 'id' in m:\n" + textwrap.indent(textwrap.dedent(answer).strip("\n"), " " * 8) + "\n"
    )
    return path
