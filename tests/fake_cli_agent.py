"""A minimal external MCP agent process, standing in for a CLI agent (e.g. a coding agent given
--mcp-config, or one that takes a server command or URL): it connects as any client would, looks
around, optionally sleeps (to test the wall-clock cap), and submits.

Usage: python tests/fake_cli_agent.py MCP_CONFIG [--hang]
       python tests/fake_cli_agent.py --stdio "SERVER COMMAND LINE" [--hang]
       python tests/fake_cli_agent.py --url URL --token TOKEN [--hang]
"""

from __future__ import annotations

import argparse
import json
import shlex
import time

import anyio
import httpx2
from mcp import Client, StdioServerParameters


async def act(c: Client, hang: bool) -> None:
    tools = {t.name for t in (await c.list_tools()).tools}
    first = "list_devices" if "list_devices" in tools else "get_topology" if "get_topology" in tools else "list_service_classes"
    await c.call_tool(first, {})
    if hang:
        time.sleep(3600)
    await c.call_tool("submit", {})


async def main(args: argparse.Namespace) -> None:
    if args.url:
        from mcp.client.streamable_http import streamable_http_client

        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {args.token}"}) as http:
            async with Client(streamable_http_client(args.url, http_client=http), mode="legacy") as c:
                await act(c, args.hang)
        return
    if args.stdio:
        argv = shlex.split(args.stdio)
        params = StdioServerParameters(command=argv[0], args=argv[1:])
    else:
        server = next(iter(json.load(open(args.config))["mcpServers"].values()))
        params = StdioServerParameters(command=server["command"], args=server["args"])
    async with Client(params, mode="legacy") as c:
        await act(c, args.hang)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("config", nargs="?")
    ap.add_argument("--stdio")
    ap.add_argument("--url")
    ap.add_argument("--token")
    ap.add_argument("--hang", action="store_true")
    anyio.run(main, ap.parse_args())
