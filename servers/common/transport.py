"""Running a server over stdio or streamable HTTP.

stdio: for Claude Desktop, Claude Code and any client that starts the server itself. Nothing but
MCP messages may go to stdout (logs go to stderr).

Streamable HTTP: binds ``127.0.0.1`` by default, with the SDK's DNS-rebinding protection (Host
and Origin headers must name a loopback address); with a bearer token configured
(``ServerConfig.bearer_token``) every request needs ``Authorization: Bearer <token>``. Binding a
non-loopback address needs a bearer token; a specific address keeps the protection on (allowing
that address too), a wildcard address (0.0.0.0, ::) relies on the token alone.
"""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Callable
from typing import Any, Literal

import anyio

from servers.common.server import AniServer, ServerSetupError

Transport = Literal["stdio", "http"]
LOOPBACK = ("127.0.0.1", "localhost", "::1")
WILDCARD = ("0.0.0.0", "::")


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_server(
    server: AniServer,
    transport: Transport = "stdio",
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    path: str = "/mcp",
    on_listen: Callable[[str], None] | None = None,
) -> None:
    """Serve until the client disconnects (stdio) or the process is interrupted (HTTP).

    Args:
        server: the level's server.
        transport: ``stdio`` or ``http`` (streamable HTTP).
        host, port, path: HTTP endpoint; port 0 picks a free port.
        on_listen: called with the endpoint URL once the HTTP socket listens (default: print
            ``listening on URL`` to stderr).

    Raises:
        OSError: the HTTP port cannot be bound.
    """
    try:
        if transport == "stdio":
            anyio.run(server.run_stdio_async)
        elif transport == "http":
            anyio.run(_serve_http, server, host, port, path, on_listen or (lambda url: _say(f"listening on {url}")))
        else:
            raise ValueError(f"unknown transport {transport!r}; use stdio or http")
    finally:
        server.close()


#: JSON-RPC error code of a server that could not start (JSON-RPC 2.0 "internal error").
SETUP_ERROR_CODE = -32603


def answer_setup_error(message: str, stdin: Any = None, stdout: Any = None) -> None:
    """Serve a start-up problem over stdio instead of closing the connection: every JSON-RPC
    request (``initialize`` first) is answered with an error whose message is ``message``, until
    the client goes away (stdin closes). A client then shows the reason (the MCP Inspector showed
    only "Connection closed", the reason being on stderr, which many clients hide); the SDK gives
    no way to fail ``initialize`` itself, so these few lines speak JSON-RPC directly.

    Args:
        message: the problem, in one line (``ServerSetupError``'s text).
        stdin, stdout: byte streams (default: the process's).
    """
    src = stdin if stdin is not None else sys.stdin.buffer
    dst = stdout if stdout is not None else sys.stdout.buffer
    text = f"anibench cannot serve: {message}"
    for line in src:
        if not line.strip():
            continue
        try:
            msg = json.loads(line)
        except ValueError:
            error = {"code": -32700, "message": "Parse error: the line is not valid JSON (one JSON-RPC message per line)"}
            msg = {"id": None, "method": "?"}
        else:
            error = {"code": SETUP_ERROR_CODE, "message": text}
        if not isinstance(msg, dict) or "method" not in msg or "id" not in msg:
            continue  # notifications and responses get no answer
        reply = {"jsonrpc": "2.0", "id": msg.get("id"), "error": error}
        dst.write(json.dumps(reply).encode() + b"\n")
        dst.flush()


class NoCredentialsChallenge:
    """ASGI wrapper: a request that sends no credentials at all (no ``Authorization`` header) gets
    a 401 whose ``WWW-Authenticate: Bearer`` challenge carries no error code, as RFC 6750 section
    3.1 asks ("If the request lacks any authentication information ..., the resource server SHOULD
    NOT include an error code or other error information"); the SDK answers it as it answers a
    wrong token (``error="invalid_token"``), which clients report as a rejected token. The same
    section counts a request "attempted using an unsupported authentication method" (``Basic``,
    any scheme but ``Bearer``) as lacking credentials: it gets the same challenge. A request with
    a Bearer credential passes through unchanged (a wrong token keeps ``invalid_token``)."""

    CHALLENGE = b'Bearer realm="anibench"'
    BODY = json.dumps({"error_description": "authentication required: send Authorization: Bearer <token>"}).encode()

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or any(k.lower() == b"authorization" and v.lower().startswith(b"bearer ")
                                              for k, v in scope.get("headers", [])):
            await self.app(scope, receive, send)
            return
        challenged = False

        async def answer(message: dict[str, Any]) -> None:
            nonlocal challenged
            if message["type"] == "http.response.start" and message.get("status") == 401:
                challenged = True
                headers = [(k, v) for k, v in message.get("headers", [])
                           if k.lower() not in (b"www-authenticate", b"content-length")]
                headers += [(b"www-authenticate", self.CHALLENGE), (b"content-length", str(len(self.BODY)).encode())]
                message = {**message, "headers": headers}
            elif message["type"] == "http.response.body" and challenged:
                if message.get("more_body"):
                    return  # the SDK's body, replaced by ours at its last chunk
                message = {"type": "http.response.body", "body": self.BODY, "more_body": False}
            await send(message)

        await self.app(scope, receive, answer)


async def _serve_http(server: AniServer, host: str, port: int, path: str, on_listen: Callable[[str], None]) -> None:
    import uvicorn
    from mcp.server.transport_security import TransportSecuritySettings

    security = None
    if host not in LOOPBACK:
        if server.config.bearer_token is None:
            raise ServerSetupError(f"serving on {host} makes the lab reachable from other machines: "
                                   "give a bearer token (--token) or bind 127.0.0.1")
        _say(f"warning: serving on {host}, reachable from other machines (bearer token required)")
        if host in WILDCARD:
            # clients arrive under any of the machine's names: the token, not the Host header,
            # is what guards the endpoint (DNS rebinding targets token-less loopback services)
            security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
        else:
            hosts = [f"{host}:*", "127.0.0.1:*", "localhost:*", "[::1]:*"]
            security = TransportSecuritySettings(
                enable_dns_rebinding_protection=True,
                allowed_hosts=hosts,
                allowed_origins=[f"http://{h}" for h in hosts],
            )
    app = server.streamable_http_app(streamable_http_path=path, host=host, transport_security=security)
    if server.config.bearer_token is not None:
        app = NoCredentialsChallenge(app)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False)
    userver = uvicorn.Server(config)
    on_listen(f"http://{shown}:{bound}{path}")
    try:
        await userver.serve(sockets=[sock])
    finally:
        sock.close()
