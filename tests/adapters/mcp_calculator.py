"""A local MCP server over stdio, for the adapter tests: ``add`` works, ``divide`` by zero fails."""

from mcp.server.fastmcp import FastMCP

server = FastMCP("calculator")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def divide(a: int, b: int) -> float:
    """Divide a by b."""
    if b == 0:
        raise ValueError("division by zero")
    return a / b


if __name__ == "__main__":
    server.run()
