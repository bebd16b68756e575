"""Helpers shared by the ANI server tests (not a test module)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

from mcp import Client, StdioServerParameters
from mcp_types import CallToolResult, Implementation

from servers.common import read_trajectory
from tests.conftest import REPO

#: Both protocol modes of the SDK: the initialize handshake most deployed clients speak, and the
#: 2026-07-28 per-request envelope.
MODES = ["legacy", "auto"]
CLIENT = Implementation(name="anibench-tests", version="1.2.3")
#: Clean shutdown of a stdio server may emit ResourceWarnings from the SDK's subprocess pipes.
HARNESS = [sys.executable, "-m", "harness.cli"]


@asynccontextmanager
async def connect(target: Any, mode: str = "legacy", **kw: Any) -> AsyncIterator[Client]:
    """An MCP client session (in-process server object, StdioServerParameters or transport)."""
    async with Client(target, mode=mode, client_info=CLIENT, **kw) as c:
        yield c


def stdio(level: str, lab: str, *extra: str) -> StdioServerParameters:
    """Parameters that start ``harness serve`` for ``level`` over stdio, as an MCP client would."""
    return StdioServerParameters(command=HARNESS[0], args=[*HARNESS[1:], "serve", "--ani", level, "--lab", lab, *extra],
                                 cwd=str(REPO))  # fmt: skip


def text(r: CallToolResult) -> str:
    return "\n".join(getattr(c, "text", "") for c in r.content)


def data(r: CallToolResult) -> dict[str, Any]:
    assert not r.is_error, text(r)
    assert r.structured_content is not None
    return r.structured_content


def records(path: Path) -> list[dict[str, Any]]:
    return read_trajectory(path)


@contextmanager
def http_server(level: str, lab: str, *extra: str) -> Iterator[str]:
    """Run ``harness serve --transport http --port 0`` and yield its URL; stop it afterwards."""
    p = subprocess.Popen([*HARNESS, "serve", "--ani", level, "--lab", lab, "--transport", "http", "--port", "0", *extra],
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)  # fmt: skip
    try:
        assert p.stderr is not None
        line = p.stderr.readline()
        m = re.search(r"listening on (http://\S+)", line)
        assert m, f"server did not start: {line}{p.stderr.read() if p.poll() is not None else ''}"
        yield m.group(1)
    finally:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        for s in (p.stdout, p.stderr):
            if s:
                s.close()


def as_json(r: CallToolResult) -> Any:
    return json.loads(text(r))


class RawStdio:
    """A bare JSON-RPC client of ``harness serve`` over stdio, as simple clients are written: one
    message per line, read with asyncio's ``StreamReader.readline`` at its DEFAULT limit (64 KiB),
    so a longer line fails here as it does in such clients. Also sends what the SDK client would
    not: cancellations at a chosen moment, lines that are not JSON.

    Use ``async with RawStdio.start(level, lab, *extra) as c``.
    """

    def __init__(self, proc: Any):
        self.proc = proc
        self.next_id = 0
        self.lines: list[bytes] = []  # every line received, for size checks

    @classmethod
    @asynccontextmanager
    async def start(cls, level: str, lab: str, *extra: str) -> AsyncIterator[RawStdio]:
        import asyncio

        proc = await asyncio.create_subprocess_exec(
            *HARNESS, "serve", "--ani", level, "--lab", lab, *extra, cwd=str(REPO),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        c = cls(proc)
        try:
            await c.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                           "clientInfo": {"name": "raw-stdio-test", "version": "0"}})  # fmt: skip
            await c.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            yield c
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()

    async def send(self, message: dict[str, Any] | str) -> None:
        line = message if isinstance(message, str) else json.dumps(message)
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()

    async def recv(self) -> dict[str, Any]:
        """The next message (raises ValueError past the 64 KiB line limit, like such clients)."""
        line = await self.proc.stdout.readline()
        if not line:
            raise EOFError("the server closed stdout")
        self.lines.append(line)
        return json.loads(line)

    async def call(self, method: str, params: dict[str, Any]) -> int:
        """Send a request; return its id (read the answer with :meth:`answer`)."""
        self.next_id += 1
        await self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        return self.next_id

    async def answer(self, rid: int) -> dict[str, Any]:
        """The response to request ``rid`` (notifications in between are skipped)."""
        while True:
            msg = await self.recv()
            if msg.get("id") == rid and ("result" in msg or "error" in msg):
                return msg

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        return await self.answer(await self.call(method, params))

    async def tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """tools/call; the CallToolResult as a dict."""
        msg = await self.request("tools/call", {"name": name, "arguments": arguments})
        assert "result" in msg, msg
        return msg["result"]
