"""Agent modes of the model-driven agent: how the model's calls are orchestrated (draft sections
5.3 and 7.3: "single-turn, ReAct, planner-executor, multi-agent; with and without recovery").

A mode is a controlled factor like the ANI level or the model (``harness campaign --mode
single-turn,react,planner-executor``). Every mode talks to the same model through the same
adapter, acts through the same MCP tools, and is bound by the same step budget (the server's), the
same token budget (``--budget-tokens``, enforced here: :meth:`Episode.complete`) and the same
wall-clock cap. What differs is only the loop and its prompts (data files,
:mod:`harness.agents.prompts`):

- ``single-turn``: one generation proposes the whole sequence of tool calls; the harness runs it in
  order and the model sees no result.
- ``react``: one conversation; after each tool call the model sees its result and chooses the next
  (NetConfArena's agent framework; the adapter's only loop before modes existed).
- ``planner-executor``: a planner call (no tools) writes a numbered plan; an executor conversation
  carries it out one step at a time and finally checks and submits.

Null actions: a model turn that makes no call the server can run -- a call whose arguments are not
a JSON object, a react or executor reply without a tool call where one was due -- is NetConfArena's
"null or unrecognized action" (section III-D); like there, it counts against the step budget
(:meth:`Episode.null_action`), so a model that never acts cannot run past it.

Recovery: on a failed tool call (the MCP result is an error, or the model's arguments are not a
JSON object), a mode *with recovery* (the plain name) goes on with the error in context -- react
shows it to the model like any result, single-turn asks for the rest of the sequence, the planner
re-plans -- while ``MODE-norecovery`` stops the run there. single-turn and planner-executor recover
at most ``recoveries`` times (agent option, default :data:`DEFAULT_RECOVERIES`).

Pure orchestration: the model is anything with the :class:`ChatModel` shape and the tools are a
:class:`harness.agents.base.ToolSession`; :mod:`harness.agents.openai_agent` binds them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from harness.agents.base import AgentOutcome, ToolSession
from harness.agents.prompts import Prompts, load
from harness.chat import observation, system_message, tool_call, tool_result
from harness.errors import AnibenchError

__all__ = ["DEFAULT_RECOVERIES", "MODES", "STOP_REASONS", "BudgetUnenforceable", "ChatModel", "Episode", "ModeSpec",
           "ModelReply", "Stop", "ToolCall", "all_modes", "numbered", "parse_mode", "parse_plan", "render_tools", "run_mode"]

#: The base modes, in the draft's order (multi-agent is not implemented).
MODES: tuple[str, ...] = ("single-turn", "react", "planner-executor")
#: Suffix of a mode without recovery.
NORECOVERY = "-norecovery"
#: Default of the ``recoveries`` agent option: recovery rounds of single-turn and re-plans of
#: planner-executor (react recovers at every failed call: its loop is the recovery).
DEFAULT_RECOVERIES = 3
#: Largest text of the model kept in an event (characters).
EVENT_TEXT_MAX = 2000

#: Why a model-driven agent ended (``AgentOutcome.stop_reason``, the run record's ``agent_stop``).
STOP_REASONS: dict[str, str] = {
    "submitted": "the agent called submit (the server ended the episode)",
    "step_budget": "the step budget was spent (tool calls the server ran, and turns that made no call it could run)",
    "token_budget": "the token budget was spent (a reply that crosses it is discarded; none is asked for once it is reached)",
    "deadline": "the wall-clock deadline passed",
    "failed_call": "a tool call failed and the mode has no recovery",
    "recoveries_exhausted": "a tool call failed after the last recovery allowed",
    "idle": "react: the model replied twice in a row without a tool call",
    "no_tool_calls": "single-turn: the model proposed no tool call",
    "sequence_done": "single-turn: the proposed sequence ran without a submit",
    "empty_plan": "planner-executor: the planner wrote no step",
    "plan_done": "planner-executor: every step ran, and the final check did not submit",
    "endpoint_error": "the model endpoint failed (see the agent's error)",
    "crash": "the agent failed on an unexpected error (see the agent's error)",
}


class ModeSpec(NamedTuple):
    """A mode: its base name and whether it recovers from a failed tool call."""

    name: str
    recovery: bool = True

    def __str__(self) -> str:
        return self.name + ("" if self.recovery else NORECOVERY)


def all_modes() -> list[str]:
    """Every mode name: each base mode with recovery, then without."""
    return [str(ModeSpec(m, r)) for m in MODES for r in (True, False)]


def parse_mode(text: str) -> ModeSpec:
    """Parse ``MODE`` or ``MODE-norecovery`` (case-insensitive).

    Raises:
        AnibenchError: unknown mode, naming the known ones.
    """
    name = text.strip().lower()
    recovery = not name.endswith(NORECOVERY)
    base = name.removesuffix(NORECOVERY)
    if base not in MODES:
        raise AnibenchError(f"unknown agent mode {text!r}; known: {', '.join(all_modes())}")
    return ModeSpec(base, recovery)


_STEP = re.compile(r"^\s*(?:step\s*)?(\d+)\s*[.):]\s*(.*\S)\s*$", re.IGNORECASE)


def parse_plan(text: str) -> list[str]:
    """The steps of a planner's reply: its numbered lines (``1.``, ``2)``, ``Step 3:``) in order;
    an unnumbered non-empty line continues the step above it (or, before the first step, is
    dropped as preamble); a reply with no numbered line is one step (or none when empty)."""
    steps: list[str] = []
    for line in text.splitlines():
        m = _STEP.match(line)
        if m:
            steps.append(m.group(2))
        elif line.strip() and steps:
            steps[-1] += " " + line.strip()
    if not steps and text.strip():
        steps = [" ".join(text.split())]
    return steps


def numbered(steps: list[str]) -> str:
    """Steps as a numbered list, one per line."""
    return "\n".join(f"{i}. {s}" for i, s in enumerate(steps, 1))


# --- the model ------------------------------------------------------------------------------------

@dataclass
class ToolCall:
    """One tool call the model asked for (arguments as the JSON text it wrote)."""

    id: str
    name: str
    arguments: str


@dataclass
class ModelReply:
    """One chat completion: text, tool calls, and the tokens it cost (``usage``: the endpoint
    reported them; when it did not, both counts are 0)."""

    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    tokens_in: int = 0
    tokens_out: int = 0
    usage: bool = True

    def message(self) -> dict[str, Any]:
        """The reply as an assistant message of the conversation."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content or ""}
        if self.tool_calls:
            msg["tool_calls"] = [tool_call(c.id, c.name, c.arguments) for c in self.tool_calls]
        return msg


class ChatModel(Protocol):
    """A chat-completions endpoint."""

    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> ModelReply:
        """One completion of ``messages`` (with ``tools`` offered, or none).

        Raises:
            AnibenchError: the endpoint failed (the run ends with the error recorded).
        """
        ...


class BudgetUnenforceable(AnibenchError):
    """The run has a token budget and the endpoint does not report the tokens it spends: the run
    cannot be conducted as specified (recorded as a failed run, not as the agent's failure)."""


class Stop(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Ends a mode's loop; ``reason`` is a key of :data:`STOP_REASONS`."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass
class Failure:
    """A failed tool call: which tool, and the error text the model saw."""

    tool: str
    text: str


# --- one episode ----------------------------------------------------------------------------------

@dataclass
class Episode:
    """What a mode works with: the model, the tools, the request, the budgets and the outcome.

    Attributes:
        model: the chat model.
        tools: the MCP session (advances the fault schedule before every call).
        tool_list: the server's tools as MCP descriptions (``name``, ``description``,
            ``inputSchema``).
        specs: the same as chat-completions tools.
        request: the HAI as a user message (prompt and attached files).
        instructions: the ANI server's instructions (appended to system prompts), or None.
        mode: the mode being run.
        recoveries: most recovery rounds (single-turn) or re-plans (planner-executor).
        budget_tokens: the token budget (prompt + completion, whole run), or None.
        budget_steps: the step budget (the server's), which null actions count against too; None:
            only the server's count.
        time_left: seconds left before the run's deadline.
        server_ended: why the server ended the episode (``submit``, ``budget``) or None.
        outcome: filled in as the episode goes (tokens, events, stop reason).
        prompt_dir: where the prompt files are read (None: the packaged ones).
    """

    model: ChatModel
    tools: ToolSession
    tool_list: list[dict[str, Any]]
    specs: list[dict[str, Any]]
    request: str
    instructions: str | None
    mode: ModeSpec
    recoveries: int
    budget_tokens: int | None
    time_left: Callable[[], float]
    server_ended: Callable[[], str | None]
    outcome: AgentOutcome
    prompt_dir: str | None = None
    budget_steps: int | None = None

    @property
    def recovery(self) -> bool:
        return self.mode.recovery

    def prompts(self, file: str) -> Prompts:
        return load(file, self.prompt_dir)

    def system(self, file: str, template: str = "system") -> dict[str, Any]:
        return {"role": "system", "content": system_message(template, file, self.instructions, self.prompt_dir)}

    def opening(self, file: str, template: str = "system") -> list[dict[str, Any]]:
        """A conversation's first two messages: a mode's system prompt and the request."""
        return [self.system(file, template), {"role": "user", "content": self.request}]

    def active(self) -> bool:
        """The episode may go on: time left and the server has not ended it."""
        return self.time_left() > 0 and self.server_ended() is None

    def event(self, kind: str, text: str = "", **extra: Any) -> None:
        """Note something the server does not see, at the current step."""
        text = text if len(text) <= EVENT_TEXT_MAX else text[:EVENT_TEXT_MAX] + " [cut]"
        self.outcome.events.append({"step": self.tools.step, "kind": kind, "text": text, **extra})

    @property
    def tokens(self) -> int:
        return self.outcome.tokens_in + self.outcome.tokens_out

    async def complete(self, messages: list[dict[str, Any]], *, with_tools: bool = True,
                       note_text: bool = True) -> ModelReply:
        """One model call under the token budget; its text noted as an event (unless
        ``note_text`` is false: the caller notes it in another form, e.g. a plan).

        Raises:
            Stop: ``token_budget`` when the budget is spent before the call, or when this reply
                takes the run over it (the reply is then discarded: no action of a run comes from
                tokens beyond its budget).
            AnibenchError: the endpoint failed, or it reported no token usage while the run has
                a token budget (which then cannot be enforced: the reply is discarded).
        """
        if self.budget_tokens is not None and self.tokens >= self.budget_tokens:
            raise Stop("token_budget")
        reply = await self.model.complete(messages, self.specs if with_tools else None)
        if not reply.usage:
            if self.budget_tokens is not None:
                raise BudgetUnenforceable(f"the model endpoint reported no token usage, so the token budget of "
                                          f"{self.budget_tokens} cannot be enforced (run without --budget-tokens, or "
                                          "use an endpoint that reports usage)")
            if not any(e["kind"] == "no_usage" for e in self.outcome.events):
                self.event("no_usage", "the model endpoint reports no token usage: this run's tokens are not counted")
        self.outcome.tokens_in += reply.tokens_in
        self.outcome.tokens_out += reply.tokens_out
        if self.budget_tokens is not None and self.tokens > self.budget_tokens:
            self.event("token_budget", f"{self.tokens} tokens used, over the budget of {self.budget_tokens}: "
                                       f"the last reply ({len(reply.tool_calls)} tool call(s)) is discarded")
            raise Stop("token_budget")
        if note_text and reply.content and reply.content.strip():
            self.event("text", reply.content.strip())
        return reply

    def null_action(self) -> None:
        """Count a model turn that made no call the server could run (see the module docstring).

        Raises:
            Stop: ``step_budget`` when the calls made and the null actions reach the step budget.
        """
        self.outcome.null_actions += 1
        if self.budget_steps is not None and self.tools.step + self.outcome.null_actions >= self.budget_steps:
            self.event("step_budget", f"{self.tools.step} tool call(s) and {self.outcome.null_actions} turn(s) without "
                                      f"a call the server could run: the step budget of {self.budget_steps} is spent")
            raise Stop("step_budget")

    async def turn(self, messages: list[dict[str, Any]]) -> ModelReply:
        """One model turn of a conversation with the tools: :meth:`complete`, its reply appended."""
        reply = await self.complete(messages)
        messages.append(reply.message())
        return reply

    async def execute(self, call: ToolCall, messages: list[dict[str, Any]]) -> Failure | None:
        """Run one tool call and append its result to ``messages``; the failure, if it failed.

        A call whose arguments are not a JSON object never reaches the server: the model is told
        so as a tool would tell it, and it counts as a failed call and a null action.

        Raises:
            Stop: ``step_budget`` (:meth:`null_action`).
        """
        try:
            args = json.loads(call.arguments or "{}")
            if not isinstance(args, dict):
                raise ValueError("arguments must be a JSON object")
        except (ValueError, RecursionError) as e:  # RecursionError: nested deeper than the parser goes
            why = "nested too deeply" if isinstance(e, RecursionError) else str(e)
            text = f"the arguments are not valid JSON ({why})"
            self.event("malformed_call", f"{call.name}: {text}", tool=call.name, arguments=call.arguments[:500])
            messages.append(tool_result(call.id, observation(False, text)))
            self.null_action()
            return Failure(call.name, text)
        r = await self.tools.call(call.name, args)
        messages.append(tool_result(call.id, observation(r.ok, r.text)))
        return None if r.ok else Failure(call.name, r.text)

    async def run_calls(self, calls: list[ToolCall], messages: list[dict[str, Any]], *,
                        stop_on_failure: bool) -> Failure | None:
        """Run the calls of one model turn in order; the first failure, if any.

        After a failure (when ``stop_on_failure``) or the end of the episode, the remaining
        calls are not run and each is answered ``not executed`` (every call of a turn must have
        an answer in the conversation).
        """
        first: Failure | None = None
        for c in calls:
            if (first is not None and stop_on_failure) or not self.active():
                why = "an earlier call of this turn failed" if first is not None else "the episode has ended"
                messages.append(tool_result(c.id, f"not executed: {why}"))
                continue
            failure = await self.execute(c, messages)
            first = first or failure
        return first

    def fail(self, failure: Failure, used: int) -> None:
        """Recovery policy after a failed call: stop without recovery, or when ``used`` recovery
        rounds already reached the limit.

        Raises:
            Stop: ``failed_call`` or ``recoveries_exhausted``.
        """
        if not self.recovery:
            raise Stop("failed_call")
        if used >= self.recoveries:
            raise Stop("recoveries_exhausted")


# --- the modes ------------------------------------------------------------------------------------

async def react(ep: Episode) -> None:
    """ReAct: act, observe, repeat (see the module docstring)."""
    messages, idle = ep.opening("react"), 0
    while ep.active():
        reply = await ep.turn(messages)
        if not reply.tool_calls:
            ep.null_action()
            idle += 1
            if idle >= 2:
                raise Stop("idle")
            messages.append({"role": "user", "content": ep.prompts("react").render("nudge")})
            continue
        idle = 0
        failure = await ep.run_calls(reply.tool_calls, messages, stop_on_failure=not ep.recovery)
        if failure is not None and not ep.recovery:
            raise Stop("failed_call")


async def single_turn(ep: Episode) -> None:
    """One generation, run without feedback; on a failure, the rest anew (see the module docstring)."""
    messages, rounds = ep.opening("single-turn"), 0
    while ep.active():
        reply = await ep.turn(messages)
        if not reply.tool_calls:
            ep.null_action()
            raise Stop("no_tool_calls")
        ep.event("sequence", ", ".join(c.name for c in reply.tool_calls))
        failure = await ep.run_calls(reply.tool_calls, messages, stop_on_failure=True)
        if failure is None:
            raise Stop("sequence_done")
        ep.fail(failure, rounds)
        rounds += 1
        ep.event("recover", f"recovery {rounds} of at most {ep.recoveries}: {failure.tool} failed")
        recover = ep.prompts("single-turn").render("recover", tool=failure.tool, error=failure.text)
        messages.append({"role": "user", "content": recover})


def render_tools(tools: list[dict[str, Any]]) -> str:
    """The tools for a planner: one line each, ``name(param, optional?): first line of description``."""
    lines = []
    for t in tools:
        schema = t.get("inputSchema") or {}
        required = set(schema.get("required") or [])
        params = ", ".join(p if p in required else f"{p}?" for p in (schema.get("properties") or {}))
        desc = (t.get("description") or "").strip().splitlines()
        lines.append(f"- {t['name']}({params}): {desc[0] if desc else ''}".rstrip(": "))
    return "\n".join(lines)


async def planner_executor(ep: Episode) -> None:
    """Plan, execute step by step, re-plan on a failed step (see the module docstring)."""
    p = ep.prompts("planner-executor")
    tools_text = render_tools(ep.tool_list)

    async def plan(kind: str, **values: Any) -> list[str]:
        template = "plan" if kind == "plan" else "replan"
        reply = await ep.complete([ep.system("planner-executor", "planner_system"),
                                   {"role": "user", "content": p.render(template, request=ep.request, tools=tools_text,
                                                                        **values)}], with_tools=False,
                                  note_text=False)
        steps = parse_plan(reply.content or "")
        raw = (reply.content or "").strip()
        written = "" if raw == numbered(steps) else f"\n\n(as the planner wrote it:)\n{raw}" if raw else ""
        ep.event(kind, (numbered(steps) or "(no step)") + written)
        if not steps:
            raise Stop("empty_plan")
        return steps

    async def run_step(messages: list[dict[str, Any]]) -> Failure | None:
        """One step (or the final check): executor turns until one without a tool call; one that
        ends without any call having run is a null action."""
        acted = ep.tools.step
        while ep.active():
            reply = await ep.turn(messages)
            if not reply.tool_calls:
                if ep.tools.step == acted:
                    ep.null_action()
                return None
            failure = await ep.run_calls(reply.tool_calls, messages, stop_on_failure=True)
            if failure is not None:
                return failure
        return None

    steps = await plan("plan")
    messages = ep.opening("planner-executor", "executor_system")
    replans = 0
    i = 0
    while i < len(steps):
        if not ep.active():
            return
        ep.event("step", f"step {i + 1} of {len(steps)}: {steps[i]}")
        messages.append({"role": "user", "content": p.render("step", plan=numbered(steps), n=i + 1, total=len(steps),
                                                             step=steps[i])})
        failure = await run_step(messages)
        if failure is None:
            i += 1
            continue
        ep.fail(failure, replans)
        replans += 1
        steps = await plan("replan", plan=numbered(steps), done=numbered(steps[:i]) or "(none)", failed_step=steps[i],
                           error=failure.text)
        i = 0
    if ep.active():
        ep.event("step", "final check")
        messages.append({"role": "user", "content": p.render("finish")})
        failure = await run_step(messages)
        if failure is not None and not ep.recovery:
            raise Stop("failed_call")
    raise Stop("plan_done")


#: Base mode -> its loop.
_LOOPS: dict[str, Callable[[Episode], Awaitable[None]]] = {
    "single-turn": single_turn,
    "react": react,
    "planner-executor": planner_executor,
}


async def run_mode(ep: Episode) -> None:
    """Run ``ep.mode`` to its end and record in ``ep.outcome`` why it ended (``stop_reason``,
    ``token_budget_hit``, and a final ``stop`` event). The server's own end of the episode
    (submit, step budget) takes precedence over the loop's reason.

    Raises:
        AnibenchError: the model endpoint failed (recorded first as ``endpoint_error``).
        Exception: anything else the loop raised (recorded first as ``crash``).
    """
    reason = "deadline"
    try:
        await _LOOPS[ep.mode.name](ep)
    except Stop as s:
        reason = s.reason
    except AnibenchError:
        reason = "endpoint_error"
        raise
    except Exception:
        reason = "crash"
        raise
    finally:
        server = ep.server_ended()
        if server is not None and reason not in ("endpoint_error", "crash"):
            reason = {"submit": "submitted", "budget": "step_budget"}.get(server, server)
        elif reason not in ("endpoint_error", "crash") and ep.time_left() <= 0:
            reason = "deadline"
        ep.outcome.stop_reason = reason
        ep.outcome.token_budget_hit = reason == "token_budget"
        ep.event("stop", STOP_REASONS.get(reason, reason), reason=reason)

