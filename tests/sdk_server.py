"""An MCP server written with the official Python SDK (``mcp``), served over stdio in one era: a real modern or legacy peer.

    python sdk_server.py modern    # 2026-07-28 only: the SDK's own stateless loop, which refuses ``initialize``
    python sdk_server.py legacy    # the handshake only (2025-11-25 and older): the SDK's handshake loop
    python sdk_server.py both      # what ``MCPServer.run("stdio")`` does: the era the client opens with

Its tools: ``add`` (structured output), ``shout`` (text), ``nested`` (an input schema with ``$defs``/``$ref``,
as pydantic writes a model inside a model), ``slow`` (sleeps), ``fail`` (a tool error). The test double here is
none: every answer comes from the SDK's server code; only the choice of its serving loop is this file's.
"""

from __future__ import annotations

import sys
import time

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server
from pydantic import BaseModel

app = MCPServer("sdk-calc", version="2.3-test", instructions="Adds numbers and shouts text.")


class Point(BaseModel):
    x: int
    y: int


@app.tool(description="Add two numbers and return their sum.")
def add(a: float, b: float) -> dict[str, float]:
    return {"sum": a + b}


@app.tool(description="Upper-case a text.")
def shout(text: str) -> str:
    return text.upper()


@app.tool(description="The sum of a point's coordinates.")
def nested(point: Point) -> dict[str, int]:
    return {"total": point.x + point.y}


@app.tool(description="Sleep, then answer.")
def slow(seconds: float) -> str:
    time.sleep(seconds)
    return "awake"


@app.tool(description="Always fails.")
def fail(message: str) -> str:
    raise ValueError(message)


async def serve(era: str) -> None:
    from mcp.server import runner

    server = app._lowlevel_server
    async with stdio_server() as (read, write), server.lifespan(server) as state:
        if era == "modern":
            # the SDK's modern-only loop (private in 2.3; what a 2026-only SDK server runs)
            await runner._serve_modern_stream(server, read, write, lifespan_state=state, raise_exceptions=False)
        elif era == "legacy":
            await runner.serve_loop(
                server, read, write, lifespan_state=state, init_options=server.create_initialization_options()
            )
        else:
            await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(serve, sys.argv[1] if len(sys.argv) > 1 else "both")
