"""An LLM agent over any OpenAI-compatible chat-completions endpoint (vLLM, Ollama, hosted APIs):
a ReAct loop with native tool calling over the level's MCP tools.

Options (``--agent-opt KEY=VALUE``, else environment): ``model`` (``ANIBENCH_MODEL``),
``base_url`` (``OPENAI_BASE_URL``), ``api_key`` (``OPENAI_API_KEY``), ``reasoning`` = on|off
(sent as ``reasoning_effort`` medium|none where the endpoint takes it; off by default: not every
endpoint accepts the field), ``temperature`` (default 0), ``request_timeout`` (s, default 120).

The system prompt follows NetConfArena's wrapper (appendix A): a fixed role and tool protocol;
the user message is the HAI request (prompt and attached files). Tokens are summed from the
endpoint's ``usage``. The loop ends when the agent submits, the server's budget is spent, the
wall-clock deadline passes, or the model stops calling tools twice in a row.
"""

from __future__ import annotations

import json
import os
from typing import Any

from harness.agents.base import AgentContext, AgentOutcome, ToolSession
from harness.errors import AnibenchError

SYSTEM_PROMPT = (
    "You are an intelligent agent for network operation, skilled at configuring networks based on the "
    "requirements you are given. You act on the network only through the tools provided; each returns an "
    "observation. Plan, act, check the result, and correct course when a tool reports an error. Do not change "
    "anything the request does not ask for. When the request is fulfilled and checked, call submit."
)
#: Largest tool-result text sent back to the model (characters).
MAX_OBSERVATION = 12000


def files_message(prompt: str, files: dict[str, str]) -> str:
    """The HAI request as one user message: the prompt, then each attached file."""
    parts = [prompt]
    for name, text in files.items():
        parts.append(f"\n--- attached file: {name} ---\n{text}")
    return "\n".join(parts)


class OpenAIAgent:
    """ReAct tool-calling agent (see module docstring)."""

    name = "openai"

    def __init__(self, **options: str):
        self.model = options.get("model") or os.environ.get("ANIBENCH_MODEL") or os.environ.get("OPENAI_MODEL")
        self.base_url = options.get("base_url") or os.environ.get("OPENAI_BASE_URL")
        self.api_key = options.get("api_key") or os.environ.get("OPENAI_API_KEY") or "none"
        self.reasoning = options.get("reasoning", "").lower()
        self.temperature = float(options.get("temperature", "0"))
        self.timeout = float(options.get("request_timeout", "120"))
        unknown = set(options) - {"model", "base_url", "api_key", "reasoning", "temperature", "request_timeout"}
        if unknown:
            raise AnibenchError(f"unknown openai agent option(s) {sorted(unknown)}; "
                                "known: model, base_url, api_key, reasoning, temperature, request_timeout")
        if self.reasoning not in ("", "on", "off"):
            raise AnibenchError(f"reasoning must be on or off, got {self.reasoning!r}")

    def _client(self) -> Any:
        from openai import AsyncOpenAI

        if not self.model:
            raise AnibenchError("the openai agent needs a model: --model NAME or --agent-opt model=NAME (or ANIBENCH_MODEL)")
        return AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, timeout=self.timeout, max_retries=1)

    def preflight(self) -> None:
        """Fail fast, in one line, when the endpoint cannot be reached.

        Raises:
            AnibenchError: no model configured, or the endpoint does not answer.
        """
        import httpx

        if not self.model:
            raise AnibenchError("the openai agent needs a model: --model NAME or --agent-opt model=NAME (or ANIBENCH_MODEL)")
        url = (self.base_url or "https://api.openai.com/v1").rstrip("/") + "/models"
        try:
            httpx.get(url, headers={"Authorization": f"Bearer {self.api_key}"}, timeout=10)
        except httpx.HTTPError as e:
            raise AnibenchError(f"model endpoint unreachable at {url}: {type(e).__name__}: {e}") from None

    async def run(self, ctx: AgentContext) -> AgentOutcome:
        import openai
        from mcp import Client

        out = AgentOutcome(model=self.model)
        try:
            llm = self._client()
        except AnibenchError as e:
            out.error = str(e)
            return out
        async with Client(ctx.server, mode="legacy") as client:
            tools = ToolSession(client, ctx.on_step)
            listed = await client.list_tools()
            specs = [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                                       "parameters": t.input_schema}} for t in listed.tools]
            messages: list[dict[str, Any]] = [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": files_message(ctx.prompt, ctx.files)},
            ]
            idle = 0
            while ctx.time_left() > 0 and not (ctx.server is not None and ctx.server.episode.ended.is_set()):
                kwargs: dict[str, Any] = {"model": self.model, "messages": messages, "tools": specs,
                                          "temperature": self.temperature}
                if self.reasoning:
                    kwargs["reasoning_effort"] = "medium" if self.reasoning == "on" else "none"
                try:
                    resp = await llm.chat.completions.create(**kwargs)
                except openai.OpenAIError as e:
                    out.error = f"model endpoint error: {type(e).__name__}: {e}"[:500]
                    break
                if resp.usage:
                    out.tokens_in += resp.usage.prompt_tokens or 0
                    out.tokens_out += resp.usage.completion_tokens or 0
                msg = resp.choices[0].message
                calls = msg.tool_calls or []
                messages.append({"role": "assistant", "content": msg.content or "",
                                 **({"tool_calls": [c.model_dump() for c in calls]} if calls else {})})
                if not calls:
                    idle += 1
                    if idle >= 2:
                        break
                    messages.append({"role": "user", "content": "Continue: call a tool, or call submit when done."})
                    continue
                idle = 0
                for c in calls:
                    try:
                        args = json.loads(c.function.arguments or "{}")
                        if not isinstance(args, dict):
                            raise ValueError("arguments must be a JSON object")
                    except ValueError as e:
                        # malformed call: the server never sees it; the model is told, as a tool would
                        messages.append({"role": "tool", "tool_call_id": c.id,
                                         "content": f"error: the arguments are not valid JSON ({e})"})
                        continue
                    r = await tools.call(c.function.name, args)
                    text = r.text if len(r.text) <= MAX_OBSERVATION else r.text[:MAX_OBSERVATION] + "\n[cut]"
                    messages.append({"role": "tool", "tool_call_id": c.id,
                                     "content": ("error: " if not r.ok else "") + text})
        return out
