"""The level-independent MCP server: lab attachment, step budget, episode state, ``submit``,
trajectory recording and error mapping around every tool call.

A level is an :class:`AniServer` plus its tools, registered with :meth:`AniServer.ani_tool`
(which takes the call's ``kind`` and the tool annotations). Everything else happens here, in
:meth:`AniServer.call_tool`, which the SDK calls for every ``tools/call`` in both protocol modes
(initialize handshake and 2026-07-28 per-request envelope) and over every transport:

1. the call gets the next sequence number; it counts as a step whatever happens next;
2. after ``submit`` (episode ended) or past the step budget the call is refused unexecuted;
3. unknown tools, unexpected or invalid arguments become errors that list what is expected; the
   argument policy (:mod:`servers.common.args`) applies first, the same for every tool;
4. the tool runs; a ``substrate`` error becomes a ``ToolError`` with a message for the agent; a
   crash is logged on the server and answered with a generic error (the server never dies); if
   the client cancels the call (or goes away), the call's cancel event is set at once, so the
   commands it runs are killed (:meth:`AniServer._run_cancellable`);
5. the result (or error text) is bounded to one JSON-RPC message, long texts cut with a handle
   that ``read_output`` pages through (:mod:`servers.common.paging`);
6. one :class:`~servers.common.recorder.CallRecord` line is appended (and fsync'd) to the
   trajectory, including for refused, failed and cancelled calls.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypeVar

import anyio
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.shared.message import SessionMessage
from mcp_types import INVALID_REQUEST, PARSE_ERROR, CallToolResult, ErrorData, JSONRPCError, TextContent, ToolAnnotations
from pydantic import BaseModel, Field, ValidationError

from servers.common.args import ARGUMENT_POLICY
from servers.common.args import normalize as normalize_arguments
from servers.common.config import ServerConfig
from servers.common.errors import argument_error, describe_parameters, from_substrate, unknown_device
from servers.common.paging import Fitter, OutputStore
from servers.common.recorder import (
    KINDS,
    CallRecord,
    ClientInfo,
    Kind,
    TrajectoryRecorder,
    bound_arguments,
    bound_text,
    read_trajectory,
    valid_text,
    valid_unicode,
)
from substrate.errors import SubstrateError
from substrate.topology import Role

log = logging.getLogger("anibench.servers")

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
_M = TypeVar("_M", bound=BaseModel)
#: A call's kind: fixed, or computed from its arguments (A0 classifies shell commands).
KindSpec = Kind | Callable[[dict[str, Any]], Kind]


class ServerSetupError(Exception):
    """The server cannot start: bad configuration, lab missing or down, trajectory unwritable."""


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("anibench")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return "0"


# -- per-call notes ------------------------------------------------------------------------------


@dataclass
class CallNote:
    """What a running tool tells the recorder beyond its result (device rejections), and the
    call's cancel event (set when the client cancels the call or goes away)."""

    rejected: list[str] = field(default_factory=list)
    cancel: threading.Event = field(default_factory=threading.Event)
    cancel_report: str | None = None
    request_id: Any = None


_CALL: ContextVar[CallNote | None] = ContextVar("anibench_call", default=None)


def cancel_event() -> threading.Event | None:
    """The current call's cancel event (None outside a call): pass it to ``Lab.exec(cancel=...)``
    so a cancelled call kills its command, and check it between steps of a multi-step tool.
    Works from sync tools (worker threads) too."""
    note = _CALL.get()
    return None if note is None else note.cancel


def note_cancelled(report: str) -> None:
    """Say what a cancelled call stopped (e.g. "the command's process group was killed after
    2.0 s"); the trajectory records it as the call's error. Outside a call it does nothing."""
    note = _CALL.get()
    if note is not None:
        note.cancel_report = report[:2000]


def note_rejected(*messages: str) -> None:
    """Record that the device or environment refused part of the current call (e.g. FRR said
    ``% Unknown command``) although the tool itself succeeded: the trajectory line gets
    ``is_error: true`` and the messages, as NetConfArena's error-action rate counts such calls.

    Works from sync tools too (the SDK copies the context into its worker thread and the note is
    shared). Outside a call it does nothing.
    """
    note = _CALL.get()
    if note is not None:
        note.rejected.extend(m[:500] for m in messages)


# -- episode: steps, budget, submit --------------------------------------------------------------


class Episode:
    """Step counter, budget and ended state of one server instance (one run).

    ``seq`` counts every tools/call received (refused ones included). Calls with ``seq`` above
    the budget are refused; after an accepted ``submit`` every call is refused.
    """

    def __init__(self, budget: int | None, previous: Iterable[dict[str, Any]] = (), trajectory: Path | None = None):
        self.budget = budget
        #: the file the episode is recorded in: refusals name it, so the user knows to pass a new one
        self.trajectory = trajectory
        self.seq = 0
        self.submit_seq: int | None = None
        self.submitted_at: float | None = None
        self._lock = threading.Lock()
        self._told = False
        self.ended = threading.Event()
        for rec in previous:  # continue a trajectory written by an earlier server process
            self.seq = max(self.seq, int(rec.get("seq", 0)))
            if rec.get("kind") == "submit" and not rec.get("is_error") and self.submit_seq is None:
                self.submit_seq, self.submitted_at = int(rec["seq"]), float(rec.get("ended_at", 0.0))
        if self.submit_seq is not None or self.budget_spent:
            self.ended.set()

    @property
    def budget_spent(self) -> bool:
        return self.budget is not None and self.seq >= self.budget

    @property
    def ended_reason(self) -> str | None:
        """``submit``, ``budget`` or None while the episode runs."""
        if self.submit_seq is not None:
            return "submit"
        return "budget" if self.budget_spent else None

    def begin(self) -> tuple[int, str | None]:
        """Number the next call; return it and the refusal reason (``episode_ended``, ``budget``) or None."""
        with self._lock:
            self.seq += 1
            seq = self.seq
            if self.submit_seq is not None:
                return seq, "episode_ended"
            if self.budget is not None and seq > self.budget:
                return seq, "budget"
            return seq, None

    def after_call(self) -> None:
        if self.budget_spent:
            self.ended.set()

    def submit(self, seq: int) -> None:
        """Accept ``submit`` as call ``seq`` and end the episode.

        Raises:
            ToolError: the episode was already submitted.
        """
        with self._lock:
            if self.submit_seq is not None:
                self.tell_operator()
                raise ToolError(f"already submitted (call {self.submit_seq}); the episode has ended")
            self.submit_seq, self.submitted_at = seq, time.time()
        self.ended.set()

    def tell_operator(self) -> None:
        """Say on the server's log (stderr, never to the agent: a host path is none of its business)
        where the ended episode is recorded and how to start a new one; once per server."""
        if self.trajectory is None or self._told:
            return
        self._told = True
        log.warning("the episode recorded in %s has ended (%s): every call is refused; to start a new episode, start "
                    "the server with a new --trajectory file", self.trajectory, self.ended_reason)

    def refusal_message(self, reason: str, seq: int) -> str:
        """The error text of a call refused for ``reason`` (``episode_ended`` or ``budget``), as the
        agent sees it (no host path: :meth:`tell_operator` says that on stderr)."""
        self.tell_operator()
        if reason == "episode_ended":
            return (
                f"the episode has ended: submit was called (call {self.submit_seq}). This call ({seq}) was not "
                "executed; no further calls are accepted."
            )
        return (
            f"step budget spent: this episode allows {self.budget} tool calls and this is call {seq}. "
            "Nothing was executed; every further call, submit included, is refused."
        )

    def continued_note(self) -> str | None:
        """One line saying that this episode continues an earlier one from its trajectory file, or
        None for a fresh episode."""
        if self.trajectory is None or self.seq == 0:
            return None
        state = (f"submitted at call {self.submit_seq}: every call will be refused" if self.submit_seq is not None
                 else "budget already spent: every call will be refused" if self.budget_spent
                 else "not submitted")  # fmt: skip
        return (f"note: continuing the episode recorded in {self.trajectory}: {self.seq} call(s) so far, {state} "
                "(pass a new --trajectory file to start a new episode)")


# -- bearer token --------------------------------------------------------------------------------


class StaticTokenVerifier:
    """Accepts exactly one bearer token (constant-time comparison)."""

    def __init__(self, token: str):
        self._token = token.encode()

    async def verify_token(self, token: str) -> AccessToken | None:
        if hmac.compare_digest(token.encode(), self._token):
            return AccessToken(token="<redacted>", client_id="anibench-agent", scopes=[])
        return None


# -- the server ----------------------------------------------------------------------------------


class OutputPage(BaseModel):
    """One page of a stored output (read_output)."""

    output_id: str
    offset: int = Field(description="Offset of the first character of text in the full output.")
    text: str = Field(description="The characters from offset on (as many as fit in one message).")
    next_offset: int | None = Field(description="Offset to read next; null when text reaches the end.")
    total_chars: int = Field(description="Length of the full output, in characters.")


class SubmitResult(BaseModel):
    """Answer of ``submit``."""

    status: str = Field(description="'submitted'.")
    steps_used: int = Field(description="Tool calls made in this episode, this one included.")
    budget_steps: int | None = Field(description="The episode's step budget (None = unlimited).")


class SettledSubmitResult(SubmitResult):
    """Answer of ``submit`` at a level that settles the network before it is evaluated (A3-R, A4:
    :data:`servers.registry.RECONCILED_LEVELS`); the other levels' answer has no such field."""

    network: str = Field(description="What was done before evaluation: the reconcile in flight waited for (or "
                                     "stopped), and whether the devices carry HEAD.")


def untitled(schema: Any, *, names: bool = False) -> Any:
    """A JSON Schema without the ``title`` keywords pydantic adds (``"title": "Devices"`` beside
    the property ``devices``, the model's class name): tools/list is resent to the model every
    turn and they say nothing the names do not. A property that is itself called ``title`` is
    kept (``names``: ``schema`` maps property names to schemas)."""
    if isinstance(schema, list):
        return [untitled(x) for x in schema]
    if not isinstance(schema, dict):
        return schema
    return {k: untitled(v, names=k in ("properties", "$defs", "patternProperties"))
            for k, v in schema.items() if names or not (k == "title" and isinstance(v, str))}


def describe(fn: Callable[..., Any]) -> str:
    """A tool's description as an agent reads it: its docstring without the source's indentation
    and trailing spaces (:func:`inspect.cleandoc`). Sources of a tool's design are kept in code
    comments, not here."""
    import inspect

    return "\n".join(line.rstrip() for line in inspect.cleandoc(fn.__doc__ or "").splitlines())


def attach_lab(name: str):  # noqa: ANN201 - substrate.Lab, imported lazily
    """Attach to a running lab.

    Raises:
        ServerSetupError: no such lab, or it is not running (the message says what to do).
    """
    from substrate.lab import Lab, require_up

    try:
        return require_up(Lab.attach(name))
    except SubstrateError as e:
        raise ServerSetupError(str(e)) from None


#: Routers named per group in :func:`own_config_routers` before the rest are only counted.
ROUTERS_NAMED = 12


def own_config_routers(topo: Any) -> str | None:
    """What the routers of ``topo`` (a lab's :class:`substrate.topology.Topology`) run, for a
    level's instructions, when some bring their own FRR configuration (an imported lab); None when
    every router runs anibench's generated IS-IS/SRv6 underlay (the level's own text then holds).

    One sentence: the routers that bring their own FRR configuration (a Containerlab lab's),
    grouped by daemon set (zebra and staticd always run, so not named), at most
    :data:`ROUTERS_NAMED` names a group; then the routers that run the underlay, if any.
    """
    groups: dict[tuple[str, ...], list[str]] = {}
    underlay: list[str] = []
    for n in topo.routers:
        if n.role is Role.EXTERNAL:  # another AS's router (ebgp_peering): not the operator's network
            continue
        if n.self_configured:
            groups.setdefault(tuple(d for d in n.frr_daemons if d not in ("zebra", "staticd")), []).append(n.name)
        else:
            underlay.append(n.name)
    if not groups:
        return None

    def names(xs: list[str]) -> str:
        more = len(xs) - ROUTERS_NAMED
        return ", ".join(xs[:ROUTERS_NAMED]) + (f" and {more} more" if more > 0 else "")

    parts = [f"{names(rs)} run{'s' if len(rs) == 1 else ''} "
             + (f"{', '.join(ds)} (with zebra and staticd)" if ds else "only zebra and staticd")
             for ds, rs in groups.items()]  # fmt: skip
    text = ("Routers run FRR 8.4 with the lab's own configuration (the lab was imported from a Containerlab "
            "topology; there is no anibench IS-IS underlay, SRv6 locator or loopback on them): " + "; ".join(parts) + ".")
    if underlay:
        text += f" Routers {names(underlay)} run anibench's IS-IS underlay (zebra, staticd, isisd) with SRv6 locators."
    return text


def _check_same_episode(path: Path, previous: list[dict[str, Any]], level: str, lab: str) -> None:
    """Refuse to continue a trajectory written by another ANI level or on another lab.

    Raises:
        ServerSetupError: naming the file, what wrote it and what to do.
    """
    for rec in previous:
        other_level, other_lab = rec.get("level"), rec.get("lab")
        if (other_level is not None and other_level != level) or (other_lab is not None and other_lab != lab):
            raise ServerSetupError(
                f"trajectory file {path} holds an episode of level {other_level} on lab {other_lab or '?'}, not "
                f"{level} on lab {lab}: pass a new --trajectory file")


class AniServer(MCPServer):
    """An MCP server of one ANI level over one lab (see module docstring).

    Args:
        config: the run's server configuration.
        level: level name for records and the server name (``A0``, ``A1``, ...).
        instructions: level-specific text for the agent (the episode rules are appended).
        lab: an attached lab (default: ``Lab.attach(config.lab)``).

    Raises:
        ServerSetupError: lab missing or down, unknown device in ``config.devices`` (None: the
            routers; ``"all"``: every node), or the
            trajectory file cannot be opened.
    """

    def __init__(self, config: ServerConfig, *, level: str, instructions: str, lab: Any = None):
        auth: dict[str, Any] = {}
        if config.bearer_token is not None:
            auth = {
                "token_verifier": StaticTokenVerifier(config.bearer_token.get_secret_value()),
                "auth": AuthSettings(issuer_url="http://127.0.0.1", resource_server_url=None),
            }
        budget = f"a budget of {config.budget_steps} tool calls" if config.budget_steps else "no step budget"
        rules = (
            f" Episode rules: every tool call counts as a step ({budget}). Call submit when the task is done; "
            "after submit (or when the budget is spent) every call is refused. A result too large for one message "
            "has its long texts cut, each ending with a marker naming an output id and offset: read_output returns "
            f"the rest. {ARGUMENT_POLICY}"
        )
        if config.tool_prefix:
            rules += (f" Every tool name of this server starts with {config.tool_prefix!r} (e.g. "
                      f"{config.tool_prefix}submit, {config.tool_prefix}read_output): the names above are without it.")
        super().__init__(
            name=f"anibench-{level.lower()}",
            title=f"anibench ANI level {level}",
            version=_version(),
            instructions=instructions + rules,
            log_level="WARNING",
            warn_on_duplicate_tools=False,
            **auth,
        )
        self.config = config
        self.level = level
        self.lab = lab if lab is not None else attach_lab(config.lab)
        #: work that must end before the process exits (see :meth:`unabandoned`)
        self._in_flight: set[threading.Event] = set()
        #: called by :meth:`close`, last registered first (a level's helper processes: A3-R's reconciler)
        self.on_close: list[Callable[[], None]] = []
        #: called by ``submit`` once the episode has ended, in order, before it answers: each makes the
        #: network final for evaluation (A3-R and A4 wait for the reconciler) and says what it did
        self.on_submit: list[Callable[[], str]] = []
        #: asked after every call of the episode (not a refused one): each returns None or a
        #: :class:`ResultNote` that the call's result carries (:meth:`_noted`): A3-R's and A4's
        #: "the reconciler is down"
        self.result_notes: list[Callable[[], ResultNote | None]] = []
        names = self.lab.node_names()
        if config.devices is None:  # the routers: customer and external hosts, and another AS's routers, are not the agent's to touch
            routers = {n.name for n in self.lab.topology.routers if n.role is not Role.EXTERNAL}
            names = [n for n in names if n in routers]
        elif config.devices != "all":
            bad = [d for d in config.devices if d not in names]
            if bad:
                raise ServerSetupError(f"devices not in lab {self.lab.name}: {', '.join(bad)}; nodes: {', '.join(names)}")
            names = [n for n in names if n in set(config.devices)]
        self.device_names: list[str] = names
        previous: list[dict[str, Any]] = []
        self.recorder: TrajectoryRecorder | None = None
        if config.trajectory is not None:
            try:
                if config.trajectory.exists():
                    previous = read_trajectory(config.trajectory)
            except (OSError, ValueError) as e:
                raise ServerSetupError(f"cannot use trajectory file {config.trajectory}: {e}") from None
            _check_same_episode(config.trajectory, previous, level, self.lab.name)
            try:
                self.recorder = TrajectoryRecorder(config.trajectory)
            except OSError as e:
                raise ServerSetupError(f"cannot use trajectory file {config.trajectory}: {e}") from None
        self.episode = Episode(config.budget_steps, previous, trajectory=config.trajectory)
        self._kinds: dict[str, KindSpec] = {}
        #: full texts of cut results, read back with read_output (servers.common.paging)
        self.outputs = OutputStore(tool=f"{config.tool_prefix}read_output")
        self.fitter = Fitter(self.outputs, config.max_message_bytes)
        self._register_submit()
        self._register_read_output()

    # -- registration ----------------------------------------------------------------------------

    def ani_tool(
        self,
        *,
        kind: KindSpec,
        read_only: bool,
        destructive: bool = False,
        idempotent: bool = False,
        title: str | None = None,
        name: str | None = None,
    ) -> Callable[[F], F]:
        """Register a tool with its call kind and truthful annotations (MCP ToolAnnotations:
        readOnlyHint, destructiveHint, idempotentHint; openWorldHint is False: a lab is a closed
        world). The docstring is the tool's description."""

        def deco(fn: F) -> F:
            tool_name = self.config.tool_prefix + (name or fn.__name__)
            self._kinds[tool_name] = kind
            self.add_tool(
                fn,
                name=tool_name,
                title=title,
                description=describe(fn),
                annotations=ToolAnnotations(
                    title=title,
                    read_only_hint=read_only,
                    destructive_hint=destructive if not read_only else False,
                    idempotent_hint=idempotent,
                    open_world_hint=False,
                ),
            )
            registered = self._tool_manager.get_tool(tool_name)
            if registered is not None:  # pydantic's titles repeat the names: noise a client resends every turn
                registered.parameters = untitled(registered.parameters)
                if registered.fn_metadata.output_schema is not None:
                    registered.fn_metadata.output_schema = untitled(registered.fn_metadata.output_schema)
            return fn

        return deco

    def set_argument_schema(self, tool: str, argument: str, schema: dict[str, Any], defs: dict[str, Any]) -> None:
        """Advertise ``schema`` for one argument of a registered tool, with JSON Schema definitions
        at the root of the tool's input schema (``$defs``) that it refers to as
        ``{"$ref": "#/$defs/NAME"}``: a shape used many times is written once. (Pydantic resolves
        refs given to ``WithJsonSchema`` against its own definitions, so they are set here.)

        Args:
            tool: the tool's name without the server's tool prefix.
            argument: the argument's name.
            schema: its JSON Schema (the description is kept from the registration if it has none).
            defs: name -> schema.

        Raises:
            KeyError: no such tool or argument.
        """
        registered = self._tool_manager.get_tool(self.config.tool_prefix + tool)
        if registered is None:
            raise KeyError(tool)
        props = dict(registered.parameters["properties"])
        props[argument] = {"description": props[argument].get("description", ""), **schema}
        registered.parameters = {**registered.parameters, "properties": props, "$defs": defs}

    def _register_submit(self) -> None:
        from servers.registry import RECONCILED_LEVELS

        server = self
        settles = self.level in RECONCILED_LEVELS

        def submit(
            note: Annotated[str, Field(max_length=4000, description="Optional summary of what was done.")] = "",
        ) -> SubmitResult:
            """End the episode: the task is done (or abandoned) and the network is to be evaluated as it is now.

            After submit every call (submit included) is refused. Counts as one step.
            """
            seq = _current_seq.get()
            server.episode.submit(seq)
            if not settles:
                return SubmitResult(status="submitted", steps_used=seq, budget_steps=server.episode.budget)
            # close() waits for these too, should the client give up on a slow submit and go away
            said = [server.unabandoned(fn)() for fn in server.on_submit]
            return SettledSubmitResult(status="submitted", steps_used=seq, budget_steps=server.episode.budget,
                                       network=" ".join(said) or "Nothing was in flight.")  # fmt: skip

        if settles:  # only these levels say it: a sentence and a field the others' lists would carry for nothing
            submit.__annotations__["return"] = SettledSubmitResult
            submit.__doc__ = (submit.__doc__ or "").rstrip() + (
                " A reconcile in flight first finishes (bounded); the result's network field says what was done.\n")
        self.ani_tool(kind="submit", read_only=False, destructive=False, idempotent=False, title="Submit")(submit)

    def _register_read_output(self) -> None:
        fitter = self.fitter

        @self.ani_tool(kind="read", read_only=True, idempotent=True, title="Read the rest of a cut output")
        def read_output(
            output_id: Annotated[str, Field(max_length=64, description='The output id a cut result names, e.g. "out-3".')],
            offset: Annotated[int, Field(ge=0, description="Where to start, in characters of the full text (the "
                                                           "offset the marker gives, or any other).")] = 0,
            max_chars: Annotated[int | None, Field(ge=1, description="At most this many characters (default: as many "
                                                                     "as fit in one message).")] = None,
        ) -> OutputPage:
            """Read a cut output from an offset. A result too large for one message has its long texts cut, each
            ending with a marker '[... cut by anibench: N more characters; read them with
            read_output(output_id="out-3", offset=K) ...]'. This returns the text from offset on, as much as fits
            in one message; call again with next_offset until it is null. Offsets count characters (Unicode code
            points) of the full text. Recent outputs are kept for the whole episode (the oldest are dropped past a
            memory bound)."""
            note = _CALL.get()

            def make(full: str, start: int, end: int) -> OutputPage:
                return OutputPage(output_id=output_id, offset=start, text=full[start:end],
                                  next_offset=end if end < len(full) else None, total_chars=len(full))  # fmt: skip

            return fitter.page(output_id, offset, max_chars, make, request_id=note.request_id if note else None)

    # -- device names --------------------------------------------------------------------------

    def device(self, name: object) -> str:
        """``name`` if it is a device of this episode, else a ToolError listing the devices."""
        if isinstance(name, str) and name in self.device_names:
            return name
        raise unknown_device(name, self.device_names)

    def devices(self, names: Iterable[object]) -> list[str]:
        """Validate several device names (duplicates removed, order kept); lists every unknown one."""
        out: list[str] = []
        bad: list[str] = []
        for n in names:
            if isinstance(n, str) and n in self.device_names:
                if n not in out:
                    out.append(n)
            else:
                bad.append(n if isinstance(n, str) else repr(n))
        if bad:
            shown = ", ".join(repr(b[:64]) for b in bad[:5])
            raise ToolError(f"unknown device{'s' if len(bad) > 1 else ''} {shown}; devices: {', '.join(self.device_names)}")
        return out

    # -- the call path ---------------------------------------------------------------------------

    def kind_of(self, name: str, arguments: dict[str, Any]) -> Kind:
        spec = self._kinds.get(name)
        if spec is None:
            return "other"
        if callable(spec):
            try:
                k = spec(arguments)
            except Exception:  # noqa: BLE001 - classification must never fail a call
                return "other"
            return k if k in KINDS else "other"
        return spec

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:  # noqa: C901
        started_at, t0 = time.time(), time.monotonic()
        seq, refusal = self.episode.begin()
        if not isinstance(arguments, dict):  # defensive: the protocol layer guarantees an object
            arguments = {}
        kind = self.kind_of(name, arguments)
        request_id = _request_id_of(context)
        note = CallNote(request_id=request_id)
        token = _CALL.set(note)
        seq_token = _current_seq.set(seq)
        result: Any = None
        error: str | None = None
        cancelled = False
        try:
            try:
                if refusal is not None:
                    raise ToolError(self.episode.refusal_message(refusal, seq))
                tool = self._tool_manager.get_tool(name)
                if tool is None:
                    tools = ", ".join(t.name for t in self._tool_manager.list_tools())
                    raise ToolError(f"unknown tool {name[:64]!r}; tools: {tools}")
                schema = tool.parameters or {}
                allowed = set(schema.get("properties", {}))
                extra = [k for k in arguments if k not in allowed]
                if extra:
                    raise ToolError(
                        f"unexpected argument{'s' if len(extra) > 1 else ''} {', '.join(repr(k[:40]) for k in extra[:5])} "
                        f"for {name}. Expected: {describe_parameters(schema)}."
                    )
                normalized, problems = normalize_arguments(arguments, schema)
                if problems:
                    raise ToolError(f"bad arguments for {name}: {'; '.join(problems[:8])}. "
                                    f"Expected: {describe_parameters(schema)}. {ARGUMENT_POLICY}")  # fmt: skip
                try:
                    result = await self._run_cancellable(name, normalized, context, note)
                except UnexpectedToolError as e:
                    cause = e.__cause__
                    if isinstance(cause, SubstrateError):
                        raise from_substrate(cause) from None
                    log.error("tool %s crashed on %s", name, json.dumps(arguments, default=str)[:500], exc_info=cause)
                    raise ToolError(
                        f"internal error in {name} (logged on the server); the call may not have been carried out. "
                        "Check the state before retrying."
                    ) from None
                except ToolError as e:
                    cause = e.__cause__
                    if isinstance(cause, ValidationError):
                        raise argument_error(name, cause, schema) from None
                    if isinstance(cause, ToolError):
                        raise ToolError(str(cause)) from None
                    raise
                if note.cancel.is_set():  # cancelled while the tool ran: the client gets no answer (MCP)
                    cancelled, error = True, _cancelled(t0, note)
                    return result
                if isinstance(result, CallToolResult):
                    wrapped = bool(getattr(tool.fn_metadata, "wrap_output", False))
                    notes = self._notes() if refusal is None else []
                    result = self._noted(result, notes, wrapped=wrapped)
                    # bounded as it travels: one JSON-RPC message (servers.common.paging)
                    result = self.fitter.fit_result(result, wrapped=wrapped, request_id=request_id)
                    if notes and wrapped and not result.is_error:  # its text shows only the wrapped value
                        result = result.model_copy(update={"content": [*result.content, _note_block(notes)]})
                    if result.is_error:
                        error = _text_of(result)
                return result
            except ToolError as e:
                said = str(e) if refusal is not None else str(e) + "".join(f"\n[{n.text}]" for n in self._notes())
                error = self.fitter.fit_error(said, request_id=request_id)
                if note.cancel.is_set():  # the tool stopped because the call was cancelled
                    cancelled, error = True, _cancelled(t0, note, f"The tool ended with: {error}")
                raise ToolError(error) from None
        except ToolError:
            raise
        except BaseException as e:  # cancelled by the client (notifications/cancelled, timeout) or shutdown
            cancelled, error = True, _cancelled(t0, note, f"({type(e).__name__}; part of the call may have run)")
            raise
        finally:
            _CALL.reset(token)
            _current_seq.reset(seq_token)
            self.episode.after_call()
            self._record(
                seq=seq, name=name, arguments=arguments, kind=kind, started_at=started_at, t0=t0,
                result=result, error=error, note=note, refusal=refusal, context=context, cancelled=cancelled,
            )  # fmt: skip

    def _notes(self) -> list[ResultNote]:
        """The notes of :attr:`result_notes` that apply now (a failing one is logged and left out)."""
        out = []
        for fn in self.result_notes:
            try:
                n = fn()
            except Exception:  # noqa: BLE001 - a note must never fail a call
                log.error("result note failed", exc_info=True)
                continue
            if n is not None:
                out.append(n)
        return out

    @staticmethod
    def _noted(result: CallToolResult, notes: list[ResultNote], *, wrapped: bool) -> CallToolResult:
        """``result`` carrying ``notes``: in its structured content under each note's key (unless the
        tool set it itself), whose text :meth:`Fitter.fit_result` re-derives; a text line added to a
        text-only or error result (a wrapped one gets its line after fitting: see call_tool)."""
        if not notes:
            return result
        structured = result.structured_content
        if isinstance(structured, dict) and not result.is_error:
            structured = {**structured, **{n.key: n.data for n in notes if n.key not in structured}}
            return result.model_copy(update={"structured_content": structured})
        if wrapped and not result.is_error:
            return result
        return result.model_copy(update={"content": [*result.content, _note_block(notes)]})

    async def _run_cancellable(self, name: str, arguments: dict[str, Any], context: Any, note: CallNote) -> Any:
        """Run the tool; when the call is cancelled (the SDK cancels the request's scope on
        ``notifications/cancelled``, a client timeout or the client going away), set the call's
        cancel event at once, so that a tool running in a worker thread stops its commands
        (``Lab.exec(cancel=...)`` kills the command's process group) instead of running to the
        end while nobody waits for it."""
        done = False

        async def watch() -> None:
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                if not done:
                    note.cancel.set()
                raise

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                try:
                    return await super().call_tool(name, arguments, context)
                finally:
                    done = True
                    tg.cancel_scope.cancel()
        except BaseExceptionGroup as eg:  # the task group wraps what the tool raised: raise it as it was
            inner = [e for e in eg.exceptions if not isinstance(e, anyio.get_cancelled_exc_class())] or list(eg.exceptions)
            raise inner[0] from inner[0].__cause__

    def _record(self, *, seq: int, name: str, arguments: dict[str, Any], kind: Kind, started_at: float, t0: float,
                result: Any, error: str | None, note: CallNote, refusal: str | None, context: Any,
                cancelled: bool = False) -> None:  # fmt: skip
        if self.recorder is None:
            return
        args, truncated = bound_arguments(arguments)
        client, proto = _client_of(context)
        rec = CallRecord(
            seq=seq,
            level=self.level,
            run_id=self.config.run_id,
            lab=self.lab.name,
            tool=valid_text(name)[:200],
            arguments=args,
            arguments_truncated=truncated,
            kind=kind,
            is_error=error is not None or bool(note.rejected),
            tool_error=error is not None and not cancelled,  # a cancelled call is not answered at all
            result=None if error is not None or result is None else bound_text(_text_of(result)),
            error=None if error is None else bound_text(error),
            rejected=valid_unicode(note.rejected[:50]),
            refused=refusal,  # type: ignore[arg-type]
            cancelled=cancelled,
            started_at=started_at,
            ended_at=time.time(),
            duration_s=time.monotonic() - t0,
            client=client,
            protocol_version=proto,
        )
        try:
            self.recorder.append(rec)
        except (OSError, ValueError) as e:  # a full disk must not kill the episode; say it loudly
            log.error("trajectory %s: cannot record call %d: %s", self.recorder.path, seq, e)

    async def run_stdio_async(self) -> None:
        """Serve over stdio until the client goes away (stdin closes).

        As the SDK's, plus: a line that is not a JSON-RPC message is answered with the JSON-RPC
        error (-32700 parse error for text that is not JSON, -32600 invalid request for JSON that
        is not a message; JSON-RPC 2.0 section 5.1) instead of silence. When stdin closes the
        SDK cancels the calls in flight; their cancel events stop the commands they run
        (:meth:`_run_cancellable`), so the server exits promptly.
        """
        from mcp.server.stdio import stdio_server

        async with stdio_server() as (read_stream, write_stream):
            send, receive = anyio.create_memory_object_stream[Any](0)

            async def pump() -> None:
                async with send:
                    async for item in read_stream:
                        if isinstance(item, Exception):
                            try:
                                await write_stream.send(SessionMessage(_protocol_error(item)))
                            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                                return
                            continue
                        await send.send(item)

            async with anyio.create_task_group() as tg:
                tg.start_soon(pump)
                await self._lowlevel_server.run(receive, write_stream, self._lowlevel_server.create_initialization_options())
                tg.cancel_scope.cancel()

    def unabandoned(self, fn: Callable[[], T]) -> Callable[[], T]:
        """``fn`` wrapped so that :meth:`close` waits for it: for work run in a thread that a
        cancelled call abandons but that must reach its end (a device transaction, which ends
        undone or committed). Without it, a client that cancels and goes away lets the process
        exit mid-transaction, leaving the devices half-changed until the next server starts."""
        done = threading.Event()

        def run() -> T:
            try:
                return fn()
            finally:
                done.set()
                self._in_flight.discard(done)

        self._in_flight.add(done)
        return run

    def close(self, wait_s: float = 600.0) -> None:
        """Wait (up to ``wait_s``) for the work :meth:`unabandoned` covers, then close the
        trajectory file."""
        deadline = time.monotonic() + wait_s
        for done in list(self._in_flight):
            if not done.wait(max(0.0, deadline - time.monotonic())):
                log.error("exiting with work in flight after %.0f s (a transaction: the next server finishes it)", wait_s)
        for fn in reversed(self.on_close):
            try:
                fn()
            except Exception:  # noqa: BLE001 - closing goes on: the trajectory must still be closed
                log.error("close hook failed", exc_info=True)
        self.on_close.clear()
        if self.recorder is not None:
            self.recorder.close()


_current_seq: ContextVar[int] = ContextVar("anibench_seq", default=0)


def _note_block(notes: list[ResultNote]) -> TextContent:
    return TextContent(type="text", text="\n".join(f"[{n.text}]" for n in notes))


@dataclass(frozen=True)
class ResultNote:
    """A notice every tool result carries while it holds (:attr:`AniServer.result_notes`).

    Attributes:
        key: its key in a structured result, e.g. ``"reconciler_down"``.
        data: its value there (JSON-serializable).
        text: its one-line wording (added to the text of an error or a text-only result), bounded by its maker.
    """

    key: str
    data: Any
    text: str


def _text_of(result: Any) -> str:
    content = getattr(result, "content", None)
    if not content:
        return ""
    return "\n".join(getattr(c, "text", "") or f"<{getattr(c, 'type', 'content')}>" for c in content)


def _cancelled(t0: float, note: CallNote, tail: str = "") -> str:
    """The recorded error of a cancelled call: when, and what the tool says it stopped."""
    what = note.cancel_report or "the tool stopped what it ran"
    return (f"cancelled after {time.monotonic() - t0:.1f} s (the client cancelled the request or went away; it gets no "
            f"answer): {what}" + (f". {tail}" if tail else ""))  # fmt: skip


def _protocol_error(exc: Exception) -> JSONRPCError:
    """The JSON-RPC error answering an inbound line the transport could not read as a message:
    parse error (-32700) when it is not JSON, invalid request (-32600) when it is JSON but not a
    JSON-RPC message (with the message's id when it has a usable one)."""
    errors: list[dict[str, Any]] = []
    if isinstance(exc, ValidationError):
        try:
            errors = list(exc.errors())  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001
            errors = []
    if not errors or any(e.get("type") == "json_invalid" for e in errors):
        return JSONRPCError(jsonrpc="2.0", id=None, error=ErrorData(
            code=PARSE_ERROR, message="Parse error: the line is not valid JSON (one JSON-RPC message per line, UTF-8)"))
    rid = None
    for e in errors:
        value = e.get("input")
        if isinstance(value, dict) and isinstance(value.get("id"), str | int) and not isinstance(value.get("id"), bool):
            rid = value["id"]
            break
    return JSONRPCError(jsonrpc="2.0", id=rid, error=ErrorData(
        code=INVALID_REQUEST, message="Invalid Request: the JSON is not a JSON-RPC 2.0 request, notification or response"))


def _request_id_of(context: Any) -> Any:
    """The JSON-RPC id of the request being served (None when unknown, e.g. a direct call)."""
    try:
        return context.request_context.request_id
    except Exception:  # noqa: BLE001 - no request context
        return None


def _client_of(context: Any) -> tuple[ClientInfo | None, str | None]:
    try:
        rc = context.request_context
    except Exception:  # noqa: BLE001 - no request (direct call in tests)
        return None, None
    proto = getattr(rc, "protocol_version", None)
    params = getattr(rc.session, "client_params", None)
    info = getattr(params, "client_info", None)
    if info is None:
        return None, proto
    return ClientInfo(name=getattr(info, "name", None), version=getattr(info, "version", None)), proto


def level_options(model: type[_M], config: ServerConfig, level: str) -> _M:
    """``config.options`` validated by a level's options model.

    Raises:
        ServerSetupError: the first problem, with its field path and the options that exist.
    """
    try:
        return model.model_validate(config.options)
    except ValidationError as e:
        err = e.errors()[0]
        raise ServerSetupError(f"bad {level} options: {'.'.join(map(str, err['loc']))}: {err['msg']}; "
                               f"known options: {', '.join(model.model_fields)}") from None  # fmt: skip


def pid_holder(level: str) -> str:
    """Config-lock holder description of this server process."""
    return f"{level} server pid {os.getpid()}"
