"""A stand-in for a remote OpenAI-compatible model API (test double for what cannot run here).

It serves ``POST /v1/chat/completions`` and ``GET /v1/models`` on 127.0.0.1 and replays a script
of assistant turns -- tool calls or plain text -- in order, whatever the request says, recording
every request so tests can check what the agent sent (tools, messages).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


Turn = list[tuple[str, "dict[str, Any] | str"]] | str | float | bytes


class FakeOpenAI:
    """Replays ``turns``: each a list of (tool name, arguments) calls -- arguments as a dict, or as
    the raw JSON text the model wrote (which may be malformed) --, a string (text reply), or a
    number of seconds to stall before a text reply (a model too slow for the run's time cap), or
    bytes sent as the whole response body (an endpoint that answers nonsense).

    ``policy`` (optional) answers every request once ``turns`` are used up, from the request body
    (e.g. a model that reacts to what it was sent, for whole campaigns); else ``"done"``.
    ``usage=False`` leaves ``usage`` out of the replies (endpoints that do not report tokens).
    """

    def __init__(self, turns: list[Turn], *, policy: Callable[[dict[str, Any]], Turn] | None = None,
                 usage: bool = True):
        self.turns = list(turns)
        self.policy = policy
        self.usage = usage
        self.requests: list[dict[str, Any]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                self._send(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append(body)
                turn = fake.turns.pop(0) if fake.turns else fake.policy(body) if fake.policy else "done"
                n = len(fake.requests)
                if isinstance(turn, bytes):
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(turn)))
                    self.end_headers()
                    self.wfile.write(turn)
                    return
                if isinstance(turn, float):
                    time.sleep(turn)
                    turn = "done"
                if isinstance(turn, str):
                    msg: dict[str, Any] = {"role": "assistant", "content": turn}
                else:
                    msg = {"role": "assistant", "content": None, "tool_calls": [
                        {"id": f"call_{n}_{i}", "type": "function",
                         "function": {"name": name, "arguments": json.dumps(args) if not isinstance(args, str) else args}}
                        for i, (name, args) in enumerate(turn)]}
                reply: dict[str, Any] = {
                    "id": f"chatcmpl-{n}", "object": "chat.completion", "created": 0, "model": body.get("model", "fake"),
                    "choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls" if msg.get("tool_calls") else "stop"}],
                }
                if fake.usage:
                    reply["usage"] = {"prompt_tokens": 100 * n, "completion_tokens": 10, "total_tokens": 100 * n + 10}
                self._send(200, reply)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakeOpenAI:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
