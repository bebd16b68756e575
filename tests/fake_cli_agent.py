"""A minimal external MCP agent process, standing in for a CLI agent (e.g. a coding agent given
--mcp-config): it reads the MCP configuration it is given, starts the server over stdio as any
client would, looks around, optionally sleeps (to test the wall-clock cap), and submits.

Usage: python tests/fake_cli_agent.py MCP_CONFIG [--hang]
"""

from __future__ import annotations

import json
import sys
import time

import anyio
from mcp import Client, StdioServerParameters


async def main(cfg_path: str, hang: bool) -> None:
    server = next(iter(json.load(open(cfg_path))["mcpServers"].values()))
    params = StdioServerParameters(command=server["command"], args=server["args"])
    async with Client(params, mode="legacy") as c:
        tools = {t.name for t in (await c.list_tools()).tools}
        first = "list_devices" if "list_devices" in tools else "get_topology" if "get_topology" in tools else "list_service_classes"
        await c.call_tool(first, {})
        if hang:
            time.sleep(3600)
        await c.call_tool("submit", {})


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], "--hang" in sys.argv)
