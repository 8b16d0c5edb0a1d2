"""The project's own small MCP server: a calculator over stdio, the default server of the `mcp`
environment (its arithmetic tasks need nothing else) and the one its tests talk to; with
`--http PORT`, over streamable HTTP on loopback instead (at http://127.0.0.1:PORT/mcp).

    python -m agentgym_rl.envs.mcp.calculator [--http PORT]
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("calculator", log_level="WARNING")


@server.tool()
def add(a: float, b: float) -> float:
    """The sum a + b."""
    return a + b


@server.tool()
def subtract(a: float, b: float) -> float:
    """The difference a - b."""
    return a - b


@server.tool()
def multiply(a: float, b: float) -> float:
    """The product a * b."""
    return a * b


@server.tool()
def divide(a: float, b: float) -> float:
    """The quotient a / b (b must not be 0)."""
    if b == 0:
        raise ToolError("division by zero")  # a tool's failure, told to the client as an error result
    return a / b


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["--http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
