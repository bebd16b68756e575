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
