"""What an agent is to the harness: something that, given the HAI request (prompt + files) and
an MCP connection to one ANI level's server, acts until it submits, runs out of budget or time.

Agents are registered by name (``scripted``, ``noisy``, ``openai``, ``command``). The harness
measures them from the outside -- the server records every tool call -- so an agent only reports
what the server cannot see: tokens, its own errors, the model it used.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from harness.errors import AnibenchError


@dataclass
class AgentContext:
    """Everything an agent run gets.

    Attributes:
        level: ANI level name (``A0``, ``A1``, ``A3-T``, ...).
        prompt: the HAI prompt.
        files: attached files, name -> text (also written under ``workdir``).
        workdir: a directory of this run's own (files, MCP config for external agents).
        server: the level's MCP server object, for in-process agents (``mcp.Client(server)``).
        serve_argv: a command that runs the same server over stdio, for external agents.
        budget_steps: the step budget the server enforces (for the agent's information).
        budget_tokens: the token budget (prompt + completion tokens over the whole run) that a
            model-driven agent's adapter enforces; None = no token budget.
        deadline: ``time.monotonic()`` value after which the run is cut.
        on_step: called with the step number before each tool call of an in-process agent
            (the fault schedule advances on it; external agents are tracked by the harness).
        seed: this run's seed (noisy agents draw their mistakes from it).
        options: agent options from the command line (``--agent-opt key=value``).
    """

    level: str
    prompt: str
    files: dict[str, str]
    workdir: Path
    server: Any = None
    serve_argv: list[str] = field(default_factory=list)
    budget_steps: int = 60
    budget_tokens: int | None = None
    deadline: float = float("inf")
    on_step: Callable[[int], None] = lambda _step: None
    seed: int = 0
    options: dict[str, str] = field(default_factory=dict)

    def time_left(self) -> float:
        return self.deadline - time.monotonic()


@dataclass
class AgentOutcome:
    """What an agent reports about itself (the server records its actions).

    Attributes:
        tokens_in: prompt tokens over the run (from the endpoint's ``usage``).
        tokens_out: completion tokens over the run.
        model: the model it used.
        error: its own failure (endpoint error, crash), if any.
        note: free text.
        mode: its agent mode (:mod:`harness.agents.modes`), for model-driven agents.
        stop_reason: why it ended (:data:`harness.agents.modes.STOP_REASONS`), if it says.
        token_budget_hit: it stopped because the token budget was spent.
        events: what it did that the server does not see, in order -- plans, re-plans, malformed
            tool calls, text replies, its stop -- each ``{"step": tool calls made so far, "kind":
            ..., "text": ...}`` (shown on the run's trajectory page between the tool calls).
        null_actions: model turns that made no call the server could run (malformed calls,
            replies without a call where one was due; NetConfArena's null or unrecognized
            actions), counted against the step budget by the model-driven agent.
        run_failed: the run could not be conducted as the campaign specifies it (an external
            agent that could not start, a token budget the endpoint gives no means to enforce):
            the harness records a failed run with ``error``, not an agent failure.
        exit_status: an external agent process's exit status (negative: killed by that signal);
            None for in-process agents and for a process killed at the wall-clock cap.
        log: path of the agent's own log (an external process's output), if it keeps one.
    """

    tokens_in: int = 0
    tokens_out: int = 0
    model: str | None = None
    error: str | None = None
    note: str = ""
    mode: str | None = None
    stop_reason: str | None = None
    token_budget_hit: bool = False
    events: list[dict[str, Any]] = field(default_factory=list)
    null_actions: int = 0
    run_failed: bool = False
    exit_status: int | None = None
    log: str | None = None


class Agent(Protocol):
    """An agent adapter. One that keeps its running :class:`AgentOutcome` in an ``outcome``
    attribute gets its partial account (tokens, events) recorded when the harness cuts the run at
    the wall-clock cap."""

    name: str

    async def run(self, ctx: AgentContext) -> AgentOutcome:
        """Act on the network through ``ctx``'s server until done. Never raises for the agent's
        own failures: they go in ``AgentOutcome.error``."""
        ...


@dataclass
class Reply:
    """A tool result as an agent sees it."""

    ok: bool
    text: str
    data: dict[str, Any] | None = None


class ToolSession:
    """An MCP client session that advances the fault schedule before every call."""

    def __init__(self, client: Any, on_step: Callable[[int], None]):
        self.client = client
        self.on_step = on_step
        self.step = 0

    async def call(self, name: str, arguments: dict[str, Any] | None = None) -> Reply:
        import anyio

        self.step += 1
        await anyio.to_thread.run_sync(self.on_step, self.step)
        r = await self.client.call_tool(name, arguments or {})
        text = "\n".join(getattr(c, "text", "") for c in r.content)
        data = r.structured_content if isinstance(r.structured_content, dict) else None
        return Reply(ok=not r.is_error, text=text, data=data)

    async def call_full(self, name: str, arguments: dict[str, Any] | None = None) -> Reply:
        """Call, then read the rest of every text the server cut to bound the message (one
        ``read_output`` call -- one step -- per page; servers.common.paging)."""
        from servers.common.paging import complete

        r = await self.call(name, arguments)
        if r.data is None:
            return r

        async def page(output_id: str, offset: int) -> dict[str, Any] | None:
            return (await self.call("read_output", {"output_id": output_id, "offset": offset})).data

        r.data = await complete(r.data, page)
        return r

    async def call_json(self, name: str, arguments: dict[str, Any] | None = None) -> tuple[Reply, Any]:
        """Call and parse the reply's structured content or JSON text (None if neither)."""
        r = await self.call(name, arguments)
        if r.data is not None:
            return r, r.data
        try:
            return r, json.loads(r.text)
        except ValueError:
            return r, None


AGENTS: dict[str, str] = {
    "scripted": "harness.agents.scripted:ScriptedAgent",
    "noisy": "harness.agents.scripted:NoisyAgent",
    "openai": "harness.agents.openai_agent:OpenAIAgent",
    "command": "harness.agents.command:CommandAgent",
}
#: Agents that have agent modes (``--mode``): the model-driven tool-calling agent.
MODEL_AGENTS: frozenset[str] = frozenset({"openai"})
#: Agents whose token use the harness knows, so that ``--budget-tokens`` holds for them: the
#: openai adapter enforces it; the scripted operators use no tokens. An external command's tokens
#: are not measured.
TOKEN_BUDGET_AGENTS: frozenset[str] = frozenset({"openai", "scripted", "noisy"})


def make_agent(name: str, options: dict[str, str] | None = None) -> Agent:
    """The agent registered as ``name``, configured with ``options``.

    Raises:
        AnibenchError: unknown agent (listing the known ones) or bad options.
    """
    import importlib

    if name not in AGENTS:
        raise AnibenchError(f"unknown agent {name!r}; available: {', '.join(AGENTS)}")
    module, _, cls = AGENTS[name].partition(":")
    return getattr(importlib.import_module(module), cls)(**(options or {}))
