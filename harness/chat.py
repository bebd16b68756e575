"""OpenAI chat-completions shapes, shared by the model-driven agent and the trajectory export, so
that a conversation the agent had and one rebuilt from a run's record look the same.

Messages are plain dicts in the chat-completions format: ``{"role": "system"|"user", "content":
str}``, an assistant turn ``{"role": "assistant", "content": str|None, "tool_calls": [{"id",
"type": "function", "function": {"name", "arguments": JSON text}}]}`` and a tool result
``{"role": "tool", "tool_call_id", "content": str}``.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["MAX_OBSERVATION", "observation", "request_message", "system_message", "tool_call", "tool_result",
           "tool_specs"]

#: Largest tool-result text sent back to the model (characters); the rest is cut with a marker.
MAX_OBSERVATION = 12000


def request_message(prompt: str, files: dict[str, str], prompt_dir: str | None = None) -> str:
    """The HAI request as one user message: the prompt, then each attached file (``common.yaml``'s
    ``attached_file`` template)."""
    from harness.agents.prompts import load

    common = load("common", prompt_dir)
    return prompt + "".join(common.render("attached_file", name=n, text=t) for n, t in files.items())


def system_message(template: str, mode_file: str, instructions: str | None, prompt_dir: str | None = None) -> str:
    """A mode's system template with the ANI server's instructions appended (``common.yaml``'s
    ``server_instructions``; nothing when the server gives none)."""
    from harness.agents.prompts import load

    extra = load("common", prompt_dir).render("server_instructions", instructions=instructions) if instructions else ""
    return load(mode_file, prompt_dir).render(template, server_instructions=extra)


def tool_specs(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """MCP tool descriptions (``name``, ``description``, ``inputSchema``) as chat-completions tools."""
    return [{"type": "function", "function": {"name": t["name"], "description": t.get("description") or "",
                                              "parameters": t.get("inputSchema") or {"type": "object"}}}
            for t in tools]


def observation(ok: bool, text: str) -> str:
    """What the model reads for one tool result: the text (cut to :data:`MAX_OBSERVATION`
    characters with a marker), prefixed ``error: `` when the call failed."""
    if len(text) > MAX_OBSERVATION:
        text = text[:MAX_OBSERVATION] + "\n[cut]"
    return ("" if ok else "error: ") + text


def tool_call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    """One entry of an assistant turn's ``tool_calls`` (arguments as JSON text, as the API sends them)."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def tool_result(call_id: str, content: str) -> dict[str, Any]:
    """A tool-result message answering the call ``call_id``."""
    return {"role": "tool", "tool_call_id": call_id, "content": content}
