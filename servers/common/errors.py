"""Error mapping: every failure an agent can cause becomes a ``ToolError`` whose text says what
to fix (DESIGN.md: "a tool that fails returns an MCP error result that tells the agent what was
wrong; a server never dies on bad input").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from mcp.server.mcpserver.exceptions import ToolError
from pydantic import ValidationError

from substrate.errors import (
    ExecError,
    LabNotFoundError,
    NodeNotFoundError,
    SubstrateError,
)


def unknown_device(name: object, devices: Iterable[str]) -> ToolError:
    """``unknown device 'r9'; devices: r1, r2, ...``"""
    shown = name if isinstance(name, str) else repr(name)
    if isinstance(shown, str) and len(shown) > 64:
        shown = shown[:64] + "..."
    return ToolError(f"unknown device {shown!r}; devices: {', '.join(devices)}")


def from_substrate(exc: SubstrateError) -> ToolError:
    """The agent-facing form of a substrate error (the substrate's messages are one line and
    already say what to do; a few get context)."""
    from substrate.devstate import SnapshotError
    from substrate.locks import ConfigLockHeld

    if isinstance(exc, ConfigLockHeld):
        return ToolError(str(exc))
    if isinstance(exc, SnapshotError):
        return ToolError(f"cannot read the device state: {exc}")
    if isinstance(exc, NodeNotFoundError):
        return ToolError(str(exc))
    if isinstance(exc, ExecError):
        return ToolError(f"the device could not run the command: {exc}")
    if isinstance(exc, LabNotFoundError):
        return ToolError(f"the network is gone ({exc}); nothing more can be done in this episode")
    return ToolError(str(exc))


def _type_of(schema: Mapping[str, Any]) -> str:
    if "type" in schema:
        t = schema["type"]
        if t == "array" and isinstance(schema.get("items"), Mapping):
            return f"list of {_type_of(schema['items'])}"
        if t == "object" and isinstance(schema.get("additionalProperties"), Mapping):
            return f"object of {_type_of(schema['additionalProperties'])}"
        return str(t)
    if "anyOf" in schema:
        return " or ".join(_type_of(s) for s in schema["anyOf"] if s.get("type") != "null")
    return "value"


def describe_parameters(schema: Mapping[str, Any]) -> str:
    """One line naming each parameter of an input JSON schema with its type and whether it is
    required, e.g. ``device (string, required), timeout_s (number, default 30)``."""
    props = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    parts = []
    for name, sub in props.items():
        bits = [_type_of(sub)]
        if name in required:
            bits.append("required")
        elif sub.get("default") is None:
            bits.append("optional")
        else:
            bits.append(f"default {sub['default']!r}")
        for key, word in (("minimum", ">="), ("maximum", "<="), ("exclusiveMinimum", ">")):
            if key in sub:
                bits.append(f"{word} {sub[key]}")
        parts.append(f"{name} ({', '.join(bits)})")
    return ", ".join(parts) if parts else "no arguments"


def argument_error(tool: str, exc: ValidationError, schema: Mapping[str, Any] | None) -> ToolError:
    """A pydantic validation failure of a tool's arguments, rewritten for the agent: each bad
    field with pydantic's short message, then the tool's expected parameters."""
    problems = []
    for err in exc.errors()[:8]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "__root__") or "arguments"
        msg = err.get("msg", "invalid")
        if err.get("type") == "extra_forbidden":
            msg = "unexpected argument"
        problems.append(f"{loc}: {msg}")
    more = f" (and {len(exc.errors()) - 8} more)" if len(exc.errors()) > 8 else ""
    expected = describe_parameters(schema) if schema else ""
    return ToolError(
        f"bad arguments for {tool}: {'; '.join(problems)}{more}." + (f" Expected: {expected}." if expected else "")
    )
