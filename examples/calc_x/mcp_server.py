"""The calculator as an MCP server over stdio (``python -m examples.calc_x.mcp_server``; needs ``mcp``)."""

from __future__ import annotations

from mcp.server.fastmcp import FastMCP

from examples.calc_x.calculator import calculate

server = FastMCP("calculator")


@server.tool(name="calculator")
def calculator(expression: str) -> str:
    """Evaluate one arithmetic expression (+ - * / // % ** ^, parentheses, sqrt, round, min, max)."""
    return calculate(expression)


if __name__ == "__main__":
    server.run("stdio")
