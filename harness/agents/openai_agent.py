"""An LLM agent over any OpenAI-compatible chat-completions endpoint (vLLM, Ollama, hosted APIs)
with native tool calling over the level's MCP tools, in one of the agent modes of
:mod:`harness.agents.modes` (single-turn, react, planner-executor; each with or without recovery).

Options (``--agent-opt KEY=VALUE``, else environment): ``model`` (``ANIBENCH_MODEL``),
``base_url`` (``OPENAI_BASE_URL``), ``api_key`` (``OPENAI_API_KEY``), ``reasoning`` = on|off
(sent as ``reasoning_effort`` medium|none where the endpoint takes it; off by default: not every
endpoint accepts the field), ``temperature`` (default 0), ``request_timeout`` (s, default 120),
``mode`` (default ``react``; a campaign sets it from ``--mode``), ``recoveries`` (default
:data:`~harness.agents.modes.DEFAULT_RECOVERIES`), ``prompts`` (a directory of prompt files
replacing the packaged ones, :mod:`harness.agents.prompts`).

The prompts follow NetConfArena's wrapper (appendix A): a fixed system prompt per mode (role and
tool protocol, plus the ANI server's own instructions) and the HAI request (prompt and attached
files) as the user message. Tokens are summed from the endpoint's ``usage``; the token budget of
the run (``AgentContext.budget_tokens``) is enforced here, before and after every model call.
"""

from __future__ import annotations

import os
from typing import Any

from harness.agents.base import AgentContext, AgentOutcome, ToolSession
from harness.agents.modes import (
    DEFAULT_RECOVERIES,
    BudgetUnenforceable,
    Episode,
    ModelReply,
    ToolCall,
    parse_mode,
    run_mode,
)
from harness.chat import request_message, tool_specs
from harness.errors import AnibenchError

OPTIONS = ("model", "base_url", "api_key", "reasoning", "temperature", "request_timeout", "mode", "recoveries",
           "prompts")


class _Endpoint:
    """The :class:`~harness.agents.modes.ChatModel` of an OpenAI-compatible endpoint."""

    def __init__(self, agent: OpenAIAgent):
        from openai import AsyncOpenAI

        self.agent = agent
        self.llm = AsyncOpenAI(base_url=agent.base_url, api_key=agent.api_key, timeout=agent.timeout, max_retries=1)

    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> ModelReply:
        import json

        import openai

        from servers.common.recorder import valid_unicode

        # the conversation may hold a lone surrogate the model wrote (or a tool echoed back), which
        # the request body, UTF-8, cannot carry: sent as its escape
        kwargs: dict[str, Any] = {"model": self.agent.model, "messages": valid_unicode(messages),
                                  "temperature": self.agent.temperature}
        if tools:
            kwargs["tools"] = tools
        if self.agent.reasoning:
            kwargs["reasoning_effort"] = "medium" if self.agent.reasoning == "on" else "none"
        try:
            resp = await self.llm.chat.completions.create(**kwargs)
        except openai.OpenAIError as e:
            raise AnibenchError(f"model endpoint error: {type(e).__name__}: {e}"[:500]) from None
        except json.JSONDecodeError as e:  # a body that is not JSON
            raise AnibenchError(f"model endpoint error: its reply is not JSON ({e})"[:500]) from None
        return reply_of(resp)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def reply_of(resp: Any) -> ModelReply:
    """A chat-completions response as a :class:`ModelReply`, read defensively: the client library
    does not check the body, and an endpoint may answer anything.

    A tool call without an id gets one; one without a function or a name is kept with the name
    ``""`` (the server answers it as an unknown tool: an unrecognized action). Token counts that
    are missing or not non-negative integers make the reply's ``usage`` unknown.

    Raises:
        AnibenchError: the response has no choice or no message.
    """
    import uuid

    choices = getattr(resp, "choices", None)
    if not isinstance(choices, list) or not choices:
        raise AnibenchError("model endpoint error: its reply has no choice (not a chat completion)")
    msg = getattr(choices[0], "message", None)
    if msg is None:
        raise AnibenchError("model endpoint error: its reply's choice has no message")
    content = getattr(msg, "content", None)
    calls = []
    raw_calls = getattr(msg, "tool_calls", None)
    for c in raw_calls if isinstance(raw_calls, list) else []:
        fn = getattr(c, "function", None)
        call_id, name, args = getattr(c, "id", None), getattr(fn, "name", None), getattr(fn, "arguments", None)
        calls.append(ToolCall(call_id if isinstance(call_id, str) and call_id else f"call_{uuid.uuid4().hex[:12]}",
                              name if isinstance(name, str) else "", args if isinstance(args, str) else ""))
    usage = getattr(resp, "usage", None)
    tokens = (_count(getattr(usage, "prompt_tokens", None)), _count(getattr(usage, "completion_tokens", None)))
    known = usage is not None and None not in tokens
    return ModelReply(content if isinstance(content, str) else None, calls, tokens_in=tokens[0] or 0,
                      tokens_out=tokens[1] or 0, usage=known)


class OpenAIAgent:
    """Tool-calling agent in one agent mode (see module docstring)."""

    name = "openai"

    def __init__(self, **options: str):
        unknown = set(options) - set(OPTIONS)
        if unknown:
            raise AnibenchError(f"unknown openai agent option(s) {sorted(unknown)}; known: {', '.join(OPTIONS)}")
        self.model = options.get("model") or os.environ.get("ANIBENCH_MODEL") or os.environ.get("OPENAI_MODEL")
        self.base_url = options.get("base_url") or os.environ.get("OPENAI_BASE_URL")
        self.api_key = options.get("api_key") or os.environ.get("OPENAI_API_KEY") or "none"
        self.reasoning = options.get("reasoning", "").lower()
        if self.reasoning not in ("", "on", "off"):
            raise AnibenchError(f"reasoning must be on or off, got {self.reasoning!r}")
        try:
            self.temperature = float(options.get("temperature", "0"))
            self.timeout = float(options.get("request_timeout", "120"))
            self.recoveries = int(options.get("recoveries", str(DEFAULT_RECOVERIES)))
        except ValueError as e:
            raise AnibenchError(f"openai agent option: {e}") from None
        if self.recoveries < 0:
            raise AnibenchError(f"recoveries must be >= 0, got {self.recoveries}")
        self.mode = parse_mode(options.get("mode") or "react")
        #: The outcome of the current run, filled in as it goes (read by the harness when it cuts
        #: the run at the wall-clock cap, so the tokens spent until then are still reported).
        self.outcome: AgentOutcome | None = None
        self.prompt_dir = options.get("prompts") or None
        from harness.agents.prompts import load

        for file in ("common", self.mode.name):  # a bad prompt file fails before any run
            load(file, self.prompt_dir)

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
        """Run the mode until it ends (see :func:`harness.agents.modes.run_mode`); never raises
        for the agent's own failures (an endpoint error is the outcome's ``error``)."""
        from mcp import Client

        out = self.outcome = AgentOutcome(model=self.model, mode=str(self.mode))
        if not self.model:
            out.error = "the openai agent needs a model: --model NAME or --agent-opt model=NAME (or ANIBENCH_MODEL)"
            return out
        endpoint = _Endpoint(self)
        server = ctx.server

        def server_ended() -> str | None:
            return server.episode.ended_reason if server is not None and server.episode.ended.is_set() else None

        async with Client(server, mode="legacy") as client:
            listed = await client.list_tools()
            tools = [{"name": t.name, "description": t.description or "", "inputSchema": t.input_schema}
                     for t in listed.tools]
            ep = Episode(model=endpoint, tools=ToolSession(client, ctx.on_step), tool_list=tools,
                         specs=tool_specs(tools), request=request_message(ctx.prompt, ctx.files, self.prompt_dir),
                         instructions=client.instructions, mode=self.mode, recoveries=self.recoveries,
                         budget_tokens=ctx.budget_tokens, budget_steps=ctx.budget_steps, time_left=ctx.time_left,
                         server_ended=server_ended,
                         outcome=out, prompt_dir=self.prompt_dir)
            try:
                await run_mode(ep)
            except AnibenchError as e:
                out.error = str(e)
                out.run_failed = isinstance(e, BudgetUnenforceable)
        return out
