"""Trajectory recorder: one JSON object per tool call, appended and fsync'd per line.

The record is taken at the server, so a third-party agent's every action is captured with no
change to the agent (DESIGN.md, ANI levels). The harness reads the file to learn whether and
when the agent submitted and computes NetConfArena's process metrics from it (error-action and
repeat-action rates, ``harness.metrics``; NetConfArena section III-D), which is why each line
carries a ``kind``.

File format: UTF-8 JSON Lines, one :class:`CallRecord` per line, in the order calls ended
(``seq`` gives the order they started). A crash can at worst leave a torn last line, which
:func:`read_trajectory` skips.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

#: Classification of a call for the process metrics (harness.metrics.KINDS).
Kind = Literal["config", "validation", "read", "wait", "submit", "other"]
KINDS: tuple[str, ...] = ("config", "validation", "read", "wait", "submit", "other")
#: Why the server refused a call without running it.
Refusal = Literal["budget", "episode_ended"]
#: Bounds of what one line keeps (bytes of UTF-8 text).
RESULT_TEXT_MAX = 32 * 1024
ARGUMENTS_JSON_MAX = 64 * 1024
TRAJECTORY_SCHEMA_VERSION = 1


class ClientInfo(BaseModel):
    """The MCP client as it named itself (``clientInfo`` of initialize, or the request envelope)."""

    name: str | None = None
    version: str | None = None


class CallRecord(BaseModel):
    """One tool call as the server received and answered it."""

    schema_version: int = Field(default=TRAJECTORY_SCHEMA_VERSION, description="Version of this record's schema.")
    seq: int = Field(description="1-based index of the call among all tools/call requests the server received.")
    level: str = Field(description="ANI level of the server (A0, A1, ...).")
    run_id: str | None = Field(default=None, description="Label given by the harness (ServerConfig.run_id).")
    lab: str | None = Field(default=None, description="Lab the server acted on (a server refuses to continue a "
                            "trajectory written on another lab or at another level).")
    tool: str = Field(description="Tool name as sent by the client (may be unknown to the server).")
    arguments: Any = Field(description="Arguments as sent; a JSON string prefix when larger than 64 KiB.")
    arguments_truncated: bool = Field(default=False, description="`arguments` was cut to the bound.")
    kind: Kind = Field(description="config | validation | read | wait | submit | other (see harness.metrics).")
    is_error: bool = Field(
        description="The call was rejected by the server, the device or the environment: an error result, or a "
        "device that refused a command (e.g. FRR's '% Unknown command') although the tool itself succeeded."
    )
    tool_error: bool = Field(description="The MCP result carried isError (what the client saw as a failure); false for "
                             "a cancelled call, which is not answered.")
    result: str | None = Field(default=None, description="Text of a successful result (bounded, with a marker).")
    error: str | None = Field(default=None, description="Error text the client received.")
    rejected: list[str] = Field(default_factory=list, description="Device rejections the tool reported (bounded).")
    refused: Refusal | None = Field(default=None, description="Refused unexecuted: budget spent or episode ended.")
    cancelled: bool = Field(default=False, description="The client cancelled the call (MCP notifications/cancelled, a "
                            "client timeout) or went away while it ran; `error` says what was stopped. The client got "
                            "no result (MCP: a cancelled request is not answered).")
    started_at: float = Field(description="Epoch seconds when the server received the call.")
    ended_at: float = Field(description="Epoch seconds when the server answered.")
    duration_s: float = Field(description="Server-side wall time (monotonic clock), seconds.")
    client: ClientInfo | None = Field(default=None, description="Client name and version, when it gave them.")
    protocol_version: str | None = Field(default=None, description="MCP protocol version of the connection.")


def valid_text(text: str) -> str:
    """``text`` as valid Unicode: each lone surrogate -- which UTF-8 cannot encode, and which
    Python's JSON parser makes of a ``\\udXXX`` escape, so a model can write one in a tool call --
    written as its escape (``\\udcff``); any other text unchanged."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode()
    return text


def valid_unicode(value: Any) -> Any:
    """``value`` (JSON-like: dicts, lists, strings, numbers) with every string and key made
    :func:`valid_text`, so that it can be written as UTF-8 JSON."""
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, dict):
        return {valid_unicode(k): valid_unicode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [valid_unicode(v) for v in value]
    return value


def bound_text(text: str, limit: int = RESULT_TEXT_MAX) -> str:
    """``text`` (made :func:`valid_text`) cut to ``limit`` UTF-8 bytes with a marker saying how
    much was dropped."""
    text = valid_text(text)
    raw = text.encode()
    if len(raw) <= limit:
        return text
    kept = raw[:limit].decode(errors="ignore")
    return f"{kept}\n[... {len(raw) - limit} more bytes not recorded ...]"


def bound_arguments(arguments: Any) -> tuple[Any, bool]:
    """Arguments as recorded (made :func:`valid_unicode`): unchanged when their JSON fits the
    bound, else a JSON prefix string."""
    arguments = valid_unicode(arguments)
    try:
        text = json.dumps(arguments, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(arguments)
        return bound_text(text, ARGUMENTS_JSON_MAX), True
    if len(text.encode()) <= ARGUMENTS_JSON_MAX:
        return arguments, False
    return bound_text(text, ARGUMENTS_JSON_MAX), True


def read_trajectory(path: str | Path) -> list[dict[str, Any]]:
    """The records of a trajectory file as dicts, in file order; a torn (unparsable) last line is skipped.

    Raises:
        OSError: the file cannot be read. ValueError: a line other than the last is not JSON.
    """
    # split on "\n" only: str.splitlines() also splits on U+2028, U+0085 ..., which JSON leaves unescaped
    lines = Path(path).read_text(encoding="utf-8").split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    out: list[dict[str, Any]] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            if i == len(lines) - 1:
                break
            raise ValueError(f"{path}: line {i + 1} is not JSON") from None
    return out


class TrajectoryRecorder:
    """Appends :class:`CallRecord` lines to a file, flushed and fsync'd per line. Thread-safe.

    Opening creates parent directories; an existing file is appended to.

    Raises:
        OSError: the file cannot be opened for appending (raised by the constructor, so a
            misconfigured run fails before the agent starts).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        # a torn last line (crash mid-write) must not glue onto the next record
        size = os.fstat(self._fd).st_size
        if size:
            with open(self.path, "rb") as f:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    os.write(self._fd, b"\n")

    def append(self, record: CallRecord) -> None:
        """Write one record as one line, then fsync."""
        line = (record.model_dump_json() + "\n").encode()
        with self._lock:
            if self._fd < 0:
                raise ValueError(f"trajectory {self.path} is closed")
            os.write(self._fd, line)
            os.fsync(self._fd)

    def close(self) -> None:
        """Close the file (idempotent)."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __del__(self) -> None:  # pragma: no cover - safety net
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass
