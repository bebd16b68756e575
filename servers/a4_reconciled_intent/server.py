"""ANI level A4: A3-T's typed transactional intent written into A3-R's reconciled source of truth
(draft section 5.1, Table 1: "A4 combines both"; where commercial service orchestrators operate).

The agent has A3-T's tools (:mod:`servers.a3_intent.server`: list_service_classes, list_services,
get_service, plan_change_set, apply_change_set, get_change) plus ``reconcile_status`` and
``history`` of the source of truth (:mod:`servers.a3_reconciled.server`). What differs is what
``apply_change_set`` does (:func:`apply_recorded`):

1. the change set is planned by the A3-T planner against the live inventory; an invalid one is an
   MCP error with its field paths, and nothing is committed;
2. the records the plan leads to (every instance's spec, allocations included) are written to the
   lab's Git repository (:class:`servers.a3_reconciled.source.Repo`) and committed with a message;
3. a reconcile (:meth:`servers.a3_reconciled.reconciler.Reconciler.reconcile_once`, in this
   process, holding the lab's reconcile lock so the controller process does not interleave) turns
   the commit into an A3-T transaction: journal, pre-check, active validation, rollback;
4. a commit that did not apply (validation failed, a device refused, a lock was held) is reverted
   in the history by a second commit restoring the previous records (both kept), and reconciled
   again: the network and HEAD agree. The result is A3-T's ChangeResult with ``commit`` and
   ``revert_commit``.

The lab's reconciler process runs as at A3-R and reverts drift (changes made outside the records).
"""

from __future__ import annotations

import threading
from typing import Annotated, Any

from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from servers.a3_intent import server as a3t
from servers.a3_intent.transaction import ChangeResult, Engine
from servers.a3_reconciled import reconciler as rc
from servers.a3_reconciled.server import (
    A3ROptions,
    HistoryResult,
    StatusResult,
    history_of,
    start_reconciler,
    status_of,
)
from servers.a3_reconciled.source import SYSTEM_AUTHOR, Repo, ResetInProgress, SourceError, desired_of
from servers.common import AniServer, ServerConfig, ServerSetupError
from substrate.errors import SubstrateError

LEVEL = "A4"
INSTRUCTIONS = a3t.INSTRUCTIONS.replace("Level A3-T of anibench", "Level A4 of anibench") + (
    " At this level every applied change set is also a commit in the network's source of truth (a Git repository of "
    "service records): a change set that fails validation is rolled back on the devices and reverted in the history "
    "by a second commit; history lists the commits, reconcile_status shows whether the network equals the last commit. "
    "A reconciler also puts back any change made on the devices outside the records."
)
#: Most characters of a failure reason quoted in a revert commit's message.
REASON_CHARS = 300

APPLY_NOTE = """

        A4: the change set is first recorded as a commit in the network's source of truth (commit), then applied
        from it by a reconcile; a change set that is not applied (rolled back, refused by a device, lock held) is
        reverted in the history by a second commit (revert_commit), so the last commit always equals what the
        network carries. history lists the commits; reconcile_status tells whether the network is at HEAD."""


class A4ChangeResult(ChangeResult):
    """A3-T's ChangeResult with the source-of-truth commits of the call."""

    commit: str | None = Field(default=None, description="Commit recording the change set (none when nothing changed).")
    revert_commit: str | None = Field(default=None, description="Commit reverting it in the history when it was not applied.")


def _message(raw: list[dict[str, Any]]) -> str:
    """Commit message of a change set: its operations, e.g. 'create tenant_site t3s3; delete steering_policy sp1'."""
    ops = [" ".join(str(o.get(k)) for k in ("op", "service_class", "id") if isinstance(o, dict) and o.get(k)) for o in raw]
    text = "; ".join(ops[:8]) + (f"; ... {len(ops) - 8} more" if len(ops) > 8 else "")
    return f"apply_change_set: {text or 'change set'}"


def apply_recorded(engine: Engine, rec: rc.Reconciler, author: tuple[str, str], ops: list[Any], raw: list[dict[str, Any]],
                   allowed: set[str], cancel: threading.Event) -> A4ChangeResult:  # fmt: skip
    """Record ``ops`` as a commit and apply it by a reconcile; revert the commit when it does not apply (module docstring).

    Raises:
        ChangeSetRejected: invalid change set; nothing committed or changed.
        ToolError: the reconcile changed nothing (a lock held, a device unreadable) or git failed; the
            message says which commits were made (the change and its revert) and that the network is unchanged.
    """
    repo = rec.repo
    try:
        # no other reconcile between the commit and its reconcile, and no lab reset (which would
        # discard the commit with the repository of its epoch) until the change set is done
        with rec.lock.held(), repo.committing():
            return _apply_recorded(engine, rec, author, ops, raw, allowed, cancel)
    except ResetInProgress as e:
        raise ToolError(f"{e}; nothing was committed or changed") from None


def _apply_recorded(engine: Engine, rec: rc.Reconciler, author: tuple[str, str], ops: list[Any], raw: list[dict[str, Any]],
                    allowed: set[str], cancel: threading.Event) -> A4ChangeResult:  # fmt: skip
    """:func:`apply_recorded` under its locks."""
    repo = rec.repo
    rec.ensure_repo()
    st0 = rc.read_status(rec.lab, rec.engine.records.epoch())
    if repo.head() != st0.applied_commit:
        # HEAD holds a commit the network does not carry yet (another client's, A3-R's): the change
        # set is planned on what the network carries, so it would undo that commit. Reconcile first.
        rec.reconcile_once("commit")
        st0 = rc.read_status(rec.lab, rec.engine.records.epoch())
        if repo.head() != st0.applied_commit:
            head = repo.head() or ""
            raise ToolError(f"the source of truth's HEAD, commit {head[:12]}, is not on the network "
                            f"({st0.failed_message or (st0.last.message if st0.last else 'not applied yet')}); a change set "
                            "applied now would undo it. Wait for the reconciler (reconcile_status) or have that commit "
                            "reverted, then apply again; nothing was committed or changed")  # fmt: skip
    with repo.locked():
        # another client's working change (A3-R's uncommitted edits) is set aside, not wiped, and put back after
        aside = repo.set_aside()
    try:
        out = _record_and_apply(engine, rec, author, ops, raw, allowed, cancel)
    except ToolError as e:
        raise ToolError(f"{e}{_put_back(repo, aside)}") from None
    except BaseException:  # a refused change set (ChangeSetRejected) and the rest: the change is put back all the same
        _put_back(repo, aside)
        raise
    out.message += _put_back(repo, aside)
    return out


def _put_back(repo: Repo, aside: list[str]) -> str:
    """Put a working change :meth:`Repo.set_aside` kept back; what to tell the client (empty: none)."""
    if not aside:
        return ""
    with repo.locked():
        why = repo.put_back()
    files = ", ".join(aside[:6]) + (f" and {len(aside) - 6} more" if len(aside) > 6 else "")
    return (f" Another client's uncommitted working change ({files}) was set aside for this commit and "
            + ("put back." if why is None else f"could not be put back: {why}."))


def _record_and_apply(engine: Engine, rec: rc.Reconciler, author: tuple[str, str], ops: list[Any], raw: list[dict[str, Any]],
                      allowed: set[str], cancel: threading.Event) -> A4ChangeResult:  # fmt: skip
    """Commit the change set's records and reconcile (reverting the commit when it does not apply)."""
    repo = rec.repo
    with repo.locked():
        new = desired_of(engine.planned(ops, allowed).new)
        sc, _ = engine.inventory()
        if new == desired_of(sc):  # nothing to record: A3-T's answer (no_change, already applied as ...)
            res0 = A4ChangeResult(**engine.apply(ops, submitted=raw, allowed=allowed, cancel=cancel).model_dump())
            res0.message = rc.as_reconciled(res0.message) + " Nothing was committed to the source of truth (its records already say this)."
            return res0
        try:
            repo.set_records(new)
            cid = repo.commit(_message(raw), author)
        except SourceError as e:
            repo.discard()
            raise ToolError(f"the change set could not be recorded: {e}; nothing was committed or changed") from None
    done = rec.reconcile_once("commit")
    st = rc.read_status(rec.lab, rec.engine.records.epoch())
    res = rec.engine.records.change(done.change_id) if done.change_id else None
    if res:
        res.pop("epoch", None)
    out = A4ChangeResult.model_validate({**(res or {}), "submitted_ops": raw, "commit": cid}) if res else None
    if st.applied_commit == cid and out is not None:
        out.message = (rc.as_reconciled(out.message) + f" Committed to the source of truth as {cid[:12]}; the devices carry it "
                       "(reconciled).")  # fmt: skip
        return out
    if out is not None:
        out.message = rc.as_reconciled(out.message)
    reason = (out.message if out is not None else done.message)[:REASON_CHARS]
    with repo.locked():
        repo.checkout_tree(f"{cid}~1")
        rid = repo.commit(f"revert {cid[:12]}: not applied ({reason})", SYSTEM_AUTHOR)
    again = rec.reconcile_once("commit")
    at_head = rc.read_status(rec.lab, rec.engine.records.epoch()).applied_commit == rid
    where = (f" The commit {cid[:12]} recording it was reverted by commit {rid[:12]}; the network "
             + ("is at that commit (the records before the change set)." if at_head else f"is not yet at it: {again.message}"))  # fmt: skip
    if out is None:
        raise ToolError(f"the change set was not applied: {done.message}.{where}")
    out.revert_commit = rid
    out.message += where
    return out


def build_server(config: ServerConfig, *, lab: object = None) -> AniServer:
    """The A4 server over ``config.lab`` (a lab deployed from a scenario); starts the lab's reconciler.
    Options: A3-R's (:class:`servers.a3_reconciled.server.A3ROptions`).

    Raises:
        ServerSetupError: bad options, lab missing or not deployed from a scenario, the repository
            or the reconciler not starting.
    """
    state: dict[str, Any] = {}

    def attach(server: AniServer, engine: Engine, opts: A3ROptions):
        rec = rc.Reconciler(server.lab, mode=opts.mode, options=engine.opts,
                            devices=None if server.config.devices == "all" else set(server.device_names))
        try:
            rec.ensure_repo()
        except (SourceError, SubstrateError) as e:
            raise ServerSetupError(f"A4: cannot make the source-of-truth repository: {e}") from None
        start_reconciler(server, opts, engine)
        author = (f"agent ({config.run_id})" if config.run_id else "agent", "agent@lab.invalid")
        state.update(engine=engine, repo=rec.repo)

        def run(ops: list[Any], raw: list[dict[str, Any]], allowed: set[str], cancel: threading.Event) -> A4ChangeResult:
            return apply_recorded(engine, rec, author, ops, raw, allowed, cancel)

        return run, APPLY_NOTE

    server = a3t.build_server(config, lab=lab, level=LEVEL, instructions=INSTRUCTIONS, options_model=A3ROptions,
                              result_model=A4ChangeResult, apply_with=attach)  # fmt: skip
    engine: Engine = state["engine"]
    repo: Repo = state["repo"]

    @server.ani_tool(kind="read", read_only=True, idempotent=True, title="Reconcile status")
    def reconcile_status() -> StatusResult:
        """Whether the network equals the source of truth: HEAD, the last applied commit, a commit that failed to apply
        and why, and the last reconciles (commit, result, devices touched, drift found per device, duration)."""
        return status_of(engine, repo)

    @server.ani_tool(kind="read", read_only=True, idempotent=True, title="History")
    def history(
        limit: Annotated[int, Field(ge=1, le=100, description="Commits to return (newest first).")] = 20,
        skip: Annotated[int, Field(ge=0, le=100_000, description="Newest commits to skip.")] = 0,
    ) -> HistoryResult:
        """The source of truth's commits (newest first): id, author, time, message, files changed. Each applied change
        set is one commit; one that was not applied is followed by its revert."""
        return history_of(repo, limit, skip)

    compact_output_defs(server)
    return server


def _no_descriptions(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _no_descriptions(v) for k, v in value.items() if k != "description"}
    if isinstance(value, list):
        return [_no_descriptions(v) for v in value]
    return value


def compact_output_defs(server: AniServer) -> None:
    """Drop the field descriptions of the nested parts (``$defs``) of every tool's output schema,
    keeping each result's own fields described: A4 is A3-T's tools plus two, and its tools/list
    (55,057 bytes) was past the 50,000-byte bound every level keeps (issue 35; a client resends it
    every turn). The nested parts (validation report, rollback report, device change, ...) are
    results the agent reads with their text, each field named."""
    for tool in server._tool_manager.list_tools():  # noqa: SLF001 - the SDK offers no public setter
        schema = tool.fn_metadata.output_schema
        if schema and "$defs" in schema:
            tool.fn_metadata.output_schema = {**schema, "$defs": _no_descriptions(schema["$defs"])}


__all__ = ["A4ChangeResult", "apply_recorded", "build_server", "compact_output_defs"]
